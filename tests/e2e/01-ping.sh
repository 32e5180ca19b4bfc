#!/usr/bin/env bash
# IPv4 and IPv6 ping both ways between the host (sd0) and the LAN peer.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss; need_daemons
topo_up 1; start_ioc; start_host 1
wait_carrier sd-host up 10; log "carrier up ${WAITED_MS} ms after sd0 was configured"
ping_ok sd-host 10.50.0.2
ping_ok sd-lan 10.50.0.1
ping_ok sd-host fd50::2 -6
ping_ok sd-lan fd50::1 -6
log "host <-> LAN peer: IPv4 and IPv6 both ways"
pass "ping IPv4 and IPv6 both ways"
