// zc.c - MSG_ZEROCOPY vs plain send() TCP benchmark.
//
//   zc recv <bind-ip> <port>
//       accept one connection, read+discard with a 256 KiB buffer until EOF,
//       print bytes / wall / user+sys CPU of this process.
//   zc send <dst-ip> <port> <write-size> <plain|zc> <seconds> [ring-slots]
//       send for <seconds> with write-size writes from a ring of buffers.
//       zc mode: SO_ZEROCOPY + send(MSG_ZEROCOPY); a slot is reused only after
//       the completion for the send that last used it arrived (error queue,
//       SO_EE_ORIGIN_ZEROCOPY ranges). Counts completions and COPIED ones.
//
// Both sides set TCP_NODELAY. Blocking sockets; completions are reaped
// non-blocking every 16 sends and blocking (poll POLLERR) when the next slot
// is still pinned or send() fails with ENOBUFS.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static double cpu_self(double *u, double *s) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *u = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
    *s = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    return *u + *s;
}
static long csw(long *inv) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *inv = ru.ru_nivcsw;
    return ru.ru_nvcsw;
}
static unsigned long cpuhist[2];
static void sample_cpu(void) { int c = sched_getcpu(); if (c >= 0) cpuhist[c & 1]++; }
static void die(const char *m) { perror(m); exit(1); }

static int do_recv(const char *ip, int port) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    if (bind(ls, (void *)&a, sizeof a)) die("bind");
    if (listen(ls, 1)) die("listen");
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t bs = 256 * 1024;
    char *buf = malloc(bs);
    double u0, s0, u1, s1;
    cpu_self(&u0, &s0);
    long iv0, v0 = csw(&iv0);
    double t0 = now();
    uint64_t total = 0;
    for (;;) {
        ssize_t r = recv(fd, buf, bs, 0);
        if (r < 0) { if (errno == EINTR) continue; die("recv"); }
        if (r == 0) break;
        total += r;
        sample_cpu();
    }
    long iv1, v1 = csw(&iv1);
    double t1 = now();
    cpu_self(&u1, &s1);
    printf("recv bytes=%llu wall=%.4f user=%.4f sys=%.4f nvcsw=%ld nivcsw=%ld cpu0=%.2f\n",
           (unsigned long long)total, t1 - t0, u1 - u0, s1 - s0, v1 - v0, iv1 - iv0,
           (double)cpuhist[0] / (cpuhist[0] + cpuhist[1] + 1e-9));
    return 0;
}

// ---- zerocopy completion bookkeeping ----
#define IDMASK ((1u << 22) - 1)
static uint8_t *done;          // done[id & IDMASK]
static uint32_t low_id;        // smallest id not yet completed
static uint32_t next_id;       // next id the kernel will assign
static uint64_t n_compl, n_copied, n_notif, n_errq_calls;

static void mark(uint32_t lo, uint32_t hi, int copied) {
    n_notif++;
    for (uint32_t i = lo;; i++) {
        done[i & IDMASK] = 1;
        n_compl++;
        if (copied) n_copied++;
        if (i == hi) break;
    }
    while (low_id != next_id && done[low_id & IDMASK]) {
        done[low_id & IDMASK] = 0;
        low_id++;
    }
}

// returns number of notifications read
static int reap(int fd, int block) {
    int got = 0;
    if (block) {   // wait (bounded) for POLLERR, then drain non-blocking
        struct pollfd p = {.fd = fd, .events = 0};
        int r = poll(&p, 1, 1000);
        if (r < 0 && errno != EINTR) die("poll");
    }
    for (;;) {
        char ctrl[256];
        struct msghdr m = {.msg_control = ctrl, .msg_controllen = sizeof ctrl};
        n_errq_calls++;
        ssize_t r = recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return got;
            die("recvmsg errqueue");
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (!((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                  (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)))
                continue;
            struct sock_extended_err *e = (void *)CMSG_DATA(c);
            if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY || e->ee_errno != 0) {
                fprintf(stderr, "unexpected errqueue origin=%d errno=%d\n",
                        e->ee_origin, e->ee_errno);
                continue;
            }
            mark(e->ee_info, e->ee_data, e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED);
            got++;
        }
    }
}

static int do_send(const char *ip, int port, size_t sz, int zc, double secs, int slots) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (zc && setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) die("SO_ZEROCOPY");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    for (int i = 0;; i++) {
        if (connect(fd, (void *)&a, sizeof a) == 0) break;
        if (i > 100) die("connect");
        usleep(20000);
    }
    char *ring;
    if (posix_memalign((void **)&ring, 4096, (size_t)slots * sz)) die("alloc");
    for (size_t i = 0; i < (size_t)slots * sz; i++) ring[i] = (char)(i * 131 + 7);
    uint32_t *last = calloc(slots, sizeof *last);   // last id + 1 (0 = never used)
    done = calloc(IDMASK + 1, 1);

    double u0, s0, u1, s1;
    cpu_self(&u0, &s0);
    long iv0, v0 = csw(&iv0);
    double t0 = now(), tend = t0 + secs, t1;
    uint64_t total = 0, nsend = 0, n_enobufs = 0, n_slotwait = 0;
    int slot = 0;
    for (;;) {
        if ((nsend & 15) == 0) {
            t1 = now();
            if (t1 >= tend) break;
            sample_cpu();
            if (zc) reap(fd, 0);
        }
        char *b = ring + (size_t)slot * sz;
        if (zc) {
            // wait until the send that last used this slot has completed
            while (last[slot] && (int32_t)(last[slot] - 1 - low_id) >= 0) {
                n_slotwait++;
                reap(fd, 1);
            }
        }
        size_t off = 0;
        while (off < sz) {
            ssize_t r = send(fd, b + off, sz - off, zc ? MSG_ZEROCOPY : 0);
            if (r < 0) {
                if (errno == EINTR) continue;
                if (zc && errno == ENOBUFS) { n_enobufs++; reap(fd, 1); continue; }
                die("send");
            }
            if (zc) last[slot] = ++next_id;   // ids are 0-based; store id+1
            off += r;
        }
        total += sz;
        nsend++;
        slot = (slot + 1) % slots;
    }
    double tloop = now();
    // drain outstanding completions (bounded) so counts are complete
    if (zc) {
        double dl = now() + 3;
        while (low_id != next_id && now() < dl) reap(fd, 1);
    }
    cpu_self(&u1, &s1);
    long iv1, v1 = csw(&iv1);
    shutdown(fd, SHUT_WR);
    char tmp[64];
    while (recv(fd, tmp, sizeof tmp, 0) > 0) {}
    close(fd);
    double wall = tloop - t0;
    printf("send mode=%s size=%zu bytes=%llu wall=%.4f gbps=%.3f user=%.4f sys=%.4f "
           "sends=%llu zc_ids=%u completions=%llu copied=%llu notifs=%llu errq_calls=%llu "
           "outstanding=%u enobufs=%llu slotwaits=%llu nvcsw=%ld nivcsw=%ld cpu0=%.2f\n",
           zc ? "zc" : "plain", sz, (unsigned long long)total, wall, total * 8 / wall / 1e9,
           u1 - u0, s1 - s0, (unsigned long long)nsend, next_id,
           (unsigned long long)n_compl, (unsigned long long)n_copied,
           (unsigned long long)n_notif, (unsigned long long)n_errq_calls,
           next_id - low_id, (unsigned long long)n_enobufs, (unsigned long long)n_slotwait,
           v1 - v0, iv1 - iv0, (double)cpuhist[0] / (cpuhist[0] + cpuhist[1] + 1e-9));
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "recv")) return do_recv(argv[2], atoi(argv[3]));
    if (argc >= 7 && !strcmp(argv[1], "send"))
        return do_send(argv[2], atoi(argv[3]), strtoul(argv[4], 0, 0), !strcmp(argv[5], "zc"),
                       atof(argv[6]),
                       argc >= 8 ? atoi(argv[7]) : (int)((16u << 20) / strtoul(argv[4], 0, 0)) + 1);
    fprintf(stderr, "usage: zc recv IP PORT | zc send IP PORT SIZE plain|zc SECS [SLOTS]\n");
    return 2;
}
