#!/usr/bin/env bash
# The data path's scheduling class ([scheduling] in both daemons' TOML; README "Scheduling"):
# with class = "fifo" every data-path thread (host-driver's queue threads, its main thread
# serving queue 0 among them, and ioc-driver's workers) runs SCHED_FIFO at the priority set,
# and the IOC's main thread (listeners, handshakes) stays a normal thread; with class =
# "nice" they run at the nice level set. Traffic flows in both. A daemon that may not take
# the class (CAP_SYS_NICE taken from its bounding set, no RLIMIT_RTPRIO) says what it needs
# and exits; a real-time host that would poll is refused at set-up.
. "$(dirname "$0")/../lib.sh"
need_root; need_tool ip ping ss setpriv; need_daemons

# thread PID NAME FIELD: field FIELD (stat(5) numbering) of PID's thread named NAME, one line
# per such thread: 19 nice, 40 rt_priority, 41 policy (1 = SCHED_FIFO).
thread() {
    local f comm
    for f in /proc/"$1"/task/*/stat; do
        comm=$(sed 's/^[0-9]* (\(.*\)) .*/\1/' "$f")
        # shellcheck disable=SC2254  # NAME is a glob: ioc-worker-*
        case "$comm" in $2) sed 's/^.*) //' "$f" | awk -v n="$3" '{ print $(n - 2) }' ;; esac
    done
}
# The daemons' own pids (ip netns exec runs them as its child: exec'd in place).
ioc_pid() { pgrep -f "ioc-driver --config $1" | head -1; }
host_pid() { pgrep -f "host-driver --config $1" | head -1; }

topo_up 1
sed 's/^queues = 1$/queues = 2/' "$IOC_CONF" >"$T/ioc-2q.toml"
sed 's/^queues = 1$/queues = 2/' "$HOST_CONF" >"$T/host-2q.toml"
grep -q '^queues = 2$' "$T/host-2q.toml" || fail "could not give the host two queues"
with_class() {  # FILE OUT LINES: FILE with [scheduling] set to LINES
    sed "/^\[scheduling\]$/,/^\[/ { /^class = /d; /^# nice = /d; /^# priority = /d }" "$1" >"$2"
    printf '%b' "$3" | sed -i "/^\[scheduling\]$/r /dev/stdin" "$2"
    grep -q '^class = ' "$2" || fail "could not set [scheduling] in $2"
}

for class in fifo nice; do
    case $class in
        fifo) lines='class = "fifo"\npriority = 7\n' ;;
        nice) lines='class = "nice"\nnice = -4\n' ;;
    esac
    with_class "$T/ioc-2q.toml" "$T/ioc-$class.toml" "$lines"
    with_class "$T/host-2q.toml" "$T/host-$class.toml" "$lines"
    IOC_CONF=$T/ioc-$class.toml start_ioc
    HOST_CONF=$T/host-$class.toml start_host 1
    wait_carrier sd-host up 10
    ping_ok sd-lan 10.50.0.1
    ping_ok sd-host 10.50.0.2
    ip=$(ioc_pid "$T/ioc-$class.toml"); hp=$(host_pid "$T/host-$class.toml")
    [ -n "$ip" ] && [ -n "$hp" ] || fail "cannot find the daemons' pids"
    workers=$(thread "$ip" 'ioc-worker-*' 41 | sort -u)
    [ -n "$workers" ] || fail "no ioc-worker thread in ioc-driver $ip"
    if [ "$class" = fifo ]; then
        assert_eq "$workers" 1 "the IOC workers' policy (SCHED_FIFO)"
        assert_eq "$(thread "$ip" 'ioc-worker-*' 40 | sort -u)" 7 "the IOC workers' priority"
        assert_eq "$(thread "$ip" ioc-driver 41)" 0 "the IOC's main thread stays normal"
        assert_eq "$(thread "$hp" host-driver 41)" 1 "host-driver's main thread (queue 0)"
        assert_eq "$(thread "$hp" queue-1 41)" 1 "host-driver's queue-1 thread"
        assert_eq "$(thread "$hp" queue-1 40)" 7 "queue-1's priority"
        # SCHED_RESET_ON_FORK: what a data-path thread starts is normal (tokio's blocking
        # threads, if any, come from the main thread): none but the data path is real time.
        others=$(for t in /proc/"$hp"/task/*; do
            c=$(cat "$t/comm"); p=$(sed 's/^.*) //' "$t/stat" | awk '{ print $39 }')
            case "$c" in host-driver | queue-*) ;; *) [ "$p" = 0 ] || echo "$c:$p" ;; esac
        done)
        assert_eq "$others" "" "host-driver's other threads are normal"
    else
        assert_eq "$workers" 0 "the IOC workers' policy (SCHED_OTHER)"
        assert_eq "$(thread "$ip" 'ioc-worker-*' 19 | sort -u)" -4 "the IOC workers' nice level"
        assert_eq "$(thread "$ip" ioc-driver 19)" 0 "the IOC's main thread keeps its nice level"
        assert_eq "$(thread "$hp" queue-1 19)" -4 "host-driver's queue-1 nice level"
        assert_eq "$(thread "$hp" host-driver 19)" -4 "host-driver's main thread nice level"
    fi
    log "class $class: the data-path threads of both daemons have it, traffic flows"
    stop_host 1; stop_ioc
    run ip -n sd-host link del sd0
done

# Not permitted: CAP_SYS_NICE out of the bounding set, RLIMIT_RTPRIO 0 (as in a unit without
# latency.conf). The daemon says what would permit it, and exits.
out=$(CREDENTIALS_DIRECTORY=$T/cred/host1 timeout 10 ip netns exec sd-host setpriv --bounding-set=-sys_nice "$BIN/host-driver" \
    --config "$T/host-fifo.toml" --control-socket "$T/host-np.sock" 2>&1)
rc=$?
[ "$rc" != 0 ] || fail "a host-driver that may not take SCHED_FIFO did not exit with an error"
echo "$out" | grep -q 'scheduling: SCHED_FIFO at priority 7 is not permitted.*LimitRTPRIO=7' ||
    fail "the refusal does not say what it needs: $(echo "$out" | tail -2)"
run ip -n sd-host link del sd0 2>/dev/null || true
out=$(timeout 10 ip netns exec sd-ioc setpriv --bounding-set=-sys_nice "$BIN/ioc-driver" \
    --config "$T/ioc-fifo.toml" --control-socket "$T/ioc-np.sock" 2>&1)
rc=$?
[ "$rc" != 0 ] || fail "an ioc-driver that may not take SCHED_FIFO did not exit with an error"
echo "$out" | grep -q 'scheduling: SCHED_FIFO at priority 7 is not permitted' ||
    fail "the IOC's refusal does not say why: $(echo "$out" | tail -2)"
log "without CAP_SYS_NICE or RLIMIT_RTPRIO both daemons refuse to start: $(echo "$out" | tail -1)"

# A real-time host that would poll (fabric.spin_max_us) is refused at set-up.
sed 's/^spin_max_us = 0$/spin_max_us = 50/' "$T/host-fifo.toml" >"$T/host-fifo-spin.toml"
grep -q '^spin_max_us = 50$' "$T/host-fifo-spin.toml" || fail "could not set spin_max_us"
out=$("$BIN/host-driver" --check-config --config "$T/host-fifo-spin.toml" 2>&1)
rc=$?
[ "$rc" = 2 ] || fail "a polling real-time host: exit $rc, want 2"
echo "$out" | grep -q 'fabric.spin_max_us.*fifo' || fail "the refusal does not say why: $out"
# Busy polling (fabric.busy_poll in both daemons): the data-path threads never sleep, so
# with one IOC worker and one host queue each takes most of a core while no frame flows;
# traffic and keepalives go on; both stop cleanly. With real time it is refused at set-up.
sed -e 's/^busy_poll = false$/busy_poll = true/' -e 's/^workers = 0$/workers = 1/' "$IOC_CONF" >"$T/ioc-busy.toml"
sed 's/^busy_poll = false$/busy_poll = true/' "$HOST_CONF" >"$T/host-busy.toml"
grep -q '^workers = 1$' "$T/ioc-busy.toml" && grep -q '^busy_poll = true$' "$T/ioc-busy.toml" &&
    grep -q '^busy_poll = true$' "$T/host-busy.toml" || fail "could not set busy_poll"
# ticks PID NAME: user + system clock ticks of PID's threads named NAME.
ticks() {
    local f comm sum=0
    for f in /proc/"$1"/task/*/stat; do
        comm=$(sed 's/^[0-9]* (\(.*\)) .*/\1/' "$f")
        # shellcheck disable=SC2254  # NAME is a glob: ioc-worker-*
        case "$comm" in $2) sum=$((sum + $(sed 's/^.*) //' "$f" | awk '{ print $12 + $13 }'))) ;; esac
    done
    echo "$sum"
}
lost=$(grep -c 'fabric lost' "$T/host1.log")
IOC_CONF=$T/ioc-busy.toml start_ioc
HOST_CONF=$T/host-busy.toml start_host 1
wait_carrier sd-host up 10
ping_ok sd-host 10.50.0.2
ping_ok sd-lan 10.50.0.1
ip=$(ioc_pid "$T/ioc-busy.toml"); hp=$(host_pid "$T/host-busy.toml")
[ -n "$ip" ] && [ -n "$hp" ] || fail "cannot find the busy daemons' pids"
hz=$(getconf CLK_TCK)
w0=$(ticks "$ip" 'ioc-worker-*'); h0=$(ticks "$hp" host-driver)
sleep 2
w1=$(ticks "$ip" 'ioc-worker-*'); h1=$(ticks "$hp" host-driver)
log "busy polling, 2 s without traffic: the IOC's worker took $((w1 - w0)) ticks, host-driver's main thread $((h1 - h0)) (of $((2 * hz)) per core)"
# At least a quarter of a core each (two busy threads on two cores take about one each;
# an idle daemon that sleeps takes well under 1%, bench/run.py's idle CPU).
assert_ge "$((w1 - w0))" "$((hz / 2))" "the busy IOC worker's CPU over 2 s idle (ticks)"
assert_ge "$((h1 - h0))" "$((hz / 2))" "host-driver's busy main thread's CPU over 2 s idle (ticks)"
ping_ok sd-host 10.50.0.2
assert_eq "$(grep -c 'fabric lost' "$T/host1.log")" "$lost" "the busy host's sessions lost (keepalives go on)"
stop_host 1
assert_eq "$STOP_RC" 0 "the busy host-driver's exit status on SIGTERM"
stop_ioc
assert_eq "$STOP_RC" 0 "the busy ioc-driver's exit status on SIGTERM"
run ip -n sd-host link del sd0
sed 's/^busy_poll = false$/busy_poll = true/' "$T/host-fifo.toml" >"$T/host-fifo-busy.toml"
out=$("$BIN/host-driver" --check-config --config "$T/host-fifo-busy.toml" 2>&1)
rc=$?
[ "$rc" = 2 ] || fail "a busy real-time host: exit $rc, want 2"
echo "$out" | grep -q 'fabric.busy_poll.*fifo' || fail "the refusal does not say why: $out"
pass "scheduling classes: fifo and nice on exactly the data-path threads of both daemons; busy polling takes a core per thread; refusals say why"
