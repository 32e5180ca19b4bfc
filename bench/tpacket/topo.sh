#!/bin/bash
# usage: topo.sh up|down
if [ "$1" = up ]; then
  ip netns add tp-a; ip netns add tp-b
  ip link add tpa type veth peer name tpb
  ip link set tpa netns tp-a; ip link set tpb netns tp-b
  ip -n tp-a link set tpa up; ip -n tp-b link set tpb up
  ip -n tp-a link set lo up; ip -n tp-b link set lo up
  # no IPv6 autoconf / addresses: keep the link quiet
  ip netns exec tp-a sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.tpa.disable_ipv6=1
  ip netns exec tp-b sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.tpb.disable_ipv6=1
else
  ip netns del tp-a 2>/dev/null; ip netns del tp-b 2>/dev/null; true
fi
