/*
 * tpv3.c - AF_PACKET RX/TX microbenchmark: recvmmsg/sendmmsg vs TPACKET_V3 rings.
 *
 * Modes:
 *   rx-mmsg   recvmmsg(batch) into batch separate 64 KiB buffers (+PACKET_AUXDATA cmsg)
 *   rx-ring   TPACKET_V3 RX ring (blocks), copy each frame (vnet hdr + frame) into a
 *             64 KiB buffer (rotating over 64 buffers), release block
 *   tx-mmsg   sendmmsg(batch) from batch separate 64 KiB buffers
 *   tx-ring   TPACKET_V3 (or V2 with -V 2) TX ring, memcpy each frame from a 64 KiB
 *             source buffer into the ring slot, one send() kick per batch
 *
 * Output: one line "key=value ..." on stdout.
 *
 * Build: gcc -O2 -Wall -o tpv3 tpv3.c
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <unistd.h>
#include <getopt.h>
#include <time.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <linux/if_packet.h>
#include <linux/if_ether.h>
#include <linux/virtio_net.h>

#define BUFSZ   65536
#define NBUF    64
#define ETYPE   0x88b5
#define VNET_SZ ((int)sizeof(struct virtio_net_hdr))

static const char *mode, *ifname = "tpa";
static int fsize = 1514, secs = 5, batch = 64, vnet = 1, aux = 1, csum = 0;
static int blk_sz = 1 << 20, blk_nr = 8, tov = 2, txver = 3, txframes = 256;
static int rcvbuf = 8 << 20, idle_ms = 500, maxsecs = 20, txcopy = 1;
static int vnet_ok = -1, vnet_errno = 0, kick_nb = 0, seqchk = 0;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
	       ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void die(const char *m)
{
	fprintf(stderr, "%s: %s\n", m, strerror(errno));
	exit(1);
}

static int open_sock(int proto_rx)
{
	int fd = socket(AF_PACKET, SOCK_RAW, 0);
	if (fd < 0)
		die("socket");
	(void)proto_rx;
	return fd;
}

static void bind_sock(int fd, int proto)
{
	struct sockaddr_ll sll = {0};
	sll.sll_family = AF_PACKET;
	sll.sll_protocol = htons(proto);
	sll.sll_ifindex = if_nametoindex(ifname);
	if (!sll.sll_ifindex)
		die("if_nametoindex");
	if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
		die("bind");
}

static void set_vnet(int fd)
{
	int one = 1;
	if (!vnet)
		return;
	if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) < 0) {
		vnet_ok = 0;
		vnet_errno = errno;
		fprintf(stderr, "PACKET_VNET_HDR: %s\n", strerror(errno));
	} else
		vnet_ok = 1;
}

/* drain & reset PACKET_STATISTICS; returns drops */
static unsigned stats(int fd, unsigned *pk, unsigned *freeze)
{
	struct tpacket_stats_v3 st = {0};
	socklen_t l = sizeof(st);
	if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &st, &l) < 0)
		die("PACKET_STATISTICS");
	if (pk)
		*pk = st.tp_packets;
	if (freeze)
		*freeze = (l >= sizeof(st)) ? st.tp_freeze_q_cnt : 0;
	return st.tp_drops;
}

static char *bufs[NBUF];

static void alloc_bufs(void)
{
	for (int i = 0; i < NBUF; i++) {
		bufs[i] = aligned_alloc(4096, BUFSZ + 4096);
		memset(bufs[i], 0, BUFSZ + 4096);
	}
}

/* vnet header (optional) followed by an Ethernet frame of fsize bytes */
static int build_frame(char *p, int seq)
{
	int off = 0;
	if (vnet) {
		struct virtio_net_hdr *vh = (void *)p;
		memset(vh, 0, sizeof(*vh));
		if (csum) {	/* ask for a partial checksum: proves vnet hdr is parsed/written */
			vh->flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
			vh->csum_start = 34;
			vh->csum_offset = 16;
		}
		off = VNET_SZ;
	}
	unsigned char *e = (unsigned char *)p + off;
	static const unsigned char dst[6] = {0x02, 0, 0, 0, 0, 0xbb};
	static const unsigned char src[6] = {0x02, 0, 0, 0, 0, 0xaa};
	memcpy(e, dst, 6);
	memcpy(e + 6, src, 6);
	e[12] = ETYPE >> 8;
	e[13] = ETYPE & 0xff;
	for (int i = 14; i < fsize; i++)
		e[i] = (unsigned char)(i + seq);
	memcpy(e + 14, &seq, sizeof(seq));
	return off + fsize;
}

static volatile int stop;
static void on_alarm(int s) { (void)s; stop = 1; }

static void report(const char *m, unsigned long frames, unsigned long bytes, double t0,
		   double t1, double c0, double c1, unsigned drops, unsigned freeze,
		   unsigned long bad, unsigned long extra_calls, const char *more)
{
	double dt = t1 - t0;
	if (dt <= 0)
		dt = 1e-9;
	double cpu = c1 - c0;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("lastcpu=%d nvcsw=%ld nivcsw=%ld ", sched_getcpu(), ru.ru_nvcsw, ru.ru_nivcsw);
	printf("mode=%s size=%d frames=%lu bytes=%lu secs=%.3f fps=%.0f MBps=%.1f cpu_s=%.3f "
	       "cpu_us_per_frame=%.3f drops=%u freeze=%u bad=%lu calls=%lu vnet=%d vnet_errno=%d %s\n",
	       m, fsize, frames, bytes, dt, frames / dt, bytes / dt / 1e6, cpu,
	       frames ? cpu * 1e6 / frames : 0.0, drops, freeze, bad, extra_calls, vnet_ok,
	       vnet_errno, more ? more : "");
	fflush(stdout);
}

/* ---------------- RX: recvmmsg ---------------- */
static void rx_mmsg(void)
{
	int fd = open_sock(ETH_P_ALL);
	int one = 1;
	set_vnet(fd);
	if (aux && setsockopt(fd, SOL_PACKET, PACKET_AUXDATA, &one, sizeof(one)) < 0)
		die("PACKET_AUXDATA");
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) < 0)
		die("SO_RCVBUFFORCE");
	struct timeval tv = {0, 100000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	bind_sock(fd, ETH_P_ALL);
	stats(fd, NULL, NULL);
	alloc_bufs();

	struct mmsghdr *mm = calloc(batch, sizeof(*mm));
	struct iovec *iov = calloc(batch, sizeof(*iov));
	size_t cl = CMSG_SPACE(sizeof(struct tpacket_auxdata));
	char *ctl = calloc(batch, cl);
	for (int i = 0; i < batch; i++) {
		iov[i].iov_base = bufs[i % NBUF];
		iov[i].iov_len = BUFSZ + VNET_SZ;
		mm[i].msg_hdr.msg_iov = &iov[i];
		mm[i].msg_hdr.msg_iovlen = 1;
	}
	unsigned long frames = 0, bytes = 0, bad = 0, calls = 0, vlan = 0, seq_back = 0, seq_gap = 0;
	unsigned last_seq = 0;
	int have_seq = 0;
	double t_first = 0, t_last = 0, tstart = now();
	double c0 = cpu_s();
	int hoff = (vnet_ok == 1) ? VNET_SZ : 0;
	char vinfo[128] = "";
	for (;;) {
		for (int i = 0; i < batch; i++) {
			mm[i].msg_hdr.msg_control = ctl + i * cl;
			mm[i].msg_hdr.msg_controllen = aux ? cl : 0;
		}
		int n = recvmmsg(fd, mm, batch, MSG_WAITFORONE, NULL);
		calls++;
		double t = now();
		if (n <= 0) {
			if (n < 0 && errno != EAGAIN && errno != EINTR)
				die("recvmmsg");
			if (frames && t - t_last > idle_ms / 1e3)
				break;
			if (!frames && t - tstart > maxsecs)
				break;
			continue;
		}
		if (!frames) {
			t_first = t;
			struct virtio_net_hdr *vh = (void *)bufs[0];
			if (hoff)
				snprintf(vinfo, sizeof(vinfo), "vh_flags=%u vh_gso=%u vh_cstart=%u vh_coff=%u",
					 vh->flags, vh->gso_type, vh->csum_start, vh->csum_offset);
		}
		t_last = t;
		for (int i = 0; i < n; i++) {
			unsigned len = mm[i].msg_len;
			unsigned char *e = (unsigned char *)bufs[i % NBUF] + hoff;
			if (len < (unsigned)hoff + 14 || e[12] != (ETYPE >> 8) || e[13] != (ETYPE & 0xff))
				bad++;
			bytes += len - hoff;
			if (seqchk && len >= (unsigned)hoff + 18) {
				unsigned sq;
				memcpy(&sq, e + (len - hoff) - 4, 4);
				if (have_seq && sq <= last_seq)
					seq_back++;
				else if (have_seq && sq > last_seq + 1)
					seq_gap += sq - last_seq - 1;
				last_seq = sq;
				have_seq = 1;
			}
			struct msghdr *mh = &mm[i].msg_hdr;
			for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
				if (c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_AUXDATA) {
					struct tpacket_auxdata *a = (void *)CMSG_DATA(c);
					if (a->tp_status & TP_STATUS_VLAN_VALID)
						vlan++;
				}
			}
		}
		frames += n;
		if (t - tstart > maxsecs)
			break;
	}
	double c1 = cpu_s();
	unsigned freeze;
	unsigned drops = stats(fd, NULL, &freeze);
	char more[256];
	snprintf(more, sizeof(more), "vlan=%lu seq_back=%lu seq_gap=%lu %s", vlan, seq_back, seq_gap, vinfo);
	report("rx-mmsg", frames, bytes, t_first, t_last, c0, c1, drops, 0, bad, calls, more);
}

/* ---------------- RX: TPACKET_V3 ring ---------------- */
static void rx_ring(void)
{
	int fd = open_sock(ETH_P_ALL);
	int v = TPACKET_V3;
	if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v, sizeof(v)) < 0)
		die("PACKET_VERSION");
	set_vnet(fd);	/* must be before ring setup (EBUSY otherwise) */
	struct tpacket_req3 req = {0};
	req.tp_block_size = blk_sz;
	req.tp_block_nr = blk_nr;
	req.tp_frame_size = blk_sz;
	req.tp_frame_nr = blk_nr;
	req.tp_retire_blk_tov = tov;
	if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)) < 0)
		die("PACKET_RX_RING");
	size_t ringsz = (size_t)blk_sz * blk_nr;
	char *ring = mmap(NULL, ringsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (ring == MAP_FAILED)
		die("mmap");
	/* Try enabling vnet after the ring exists, just to record kernel behaviour */
	int one = 1, late = setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one));
	int late_errno = late < 0 ? errno : 0;
	/* Poison the data area so we can tell whether the kernel writes a vnet header */
	for (int b = 0; b < blk_nr; b++)
		memset(ring + (size_t)b * blk_sz + 4096, 0xAA, blk_sz - 4096);
	bind_sock(fd, ETH_P_ALL);
	stats(fd, NULL, NULL);
	alloc_bufs();

	unsigned long frames = 0, bytes = 0, bad = 0, calls = 0, vlan = 0, trunc = 0, blocks = 0;
	double t_first = 0, t_last = 0, tstart = now();
	double c0 = cpu_s();
	int hoff = (vnet_ok == 1) ? VNET_SZ : 0;
	unsigned bi = 0, k = 0;
	char vinfo[200] = "";
	struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLERR};
	for (;;) {
		struct tpacket_block_desc *bd = (void *)(ring + (size_t)bi * blk_sz);
		if (!(__atomic_load_n(&bd->hdr.bh1.block_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) {
			poll(&pfd, 1, 100);
			calls++;
			double t = now();
			if (frames && t - t_last > idle_ms / 1e3)
				break;
			if (t - tstart > maxsecs)
				break;
			continue;
		}
		unsigned n = bd->hdr.bh1.num_pkts;
		struct tpacket3_hdr *h = (void *)((char *)bd + bd->hdr.bh1.offset_to_first_pkt);
		double t = now();
		if (!frames && n) {
			t_first = t;
			unsigned char *m = (unsigned char *)h + h->tp_mac;
			struct virtio_net_hdr *vh = (void *)(m - VNET_SZ);
			snprintf(vinfo, sizeof(vinfo),
				 "tp_mac=%u tp_net=%u pre_mac_bytes=%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x "
				 "vh_flags=%u vh_cstart=%u vh_coff=%u late_vnet_rc=%d/%d",
				 h->tp_mac, h->tp_net, m[-10], m[-9], m[-8], m[-7], m[-6], m[-5], m[-4],
				 m[-3], m[-2], m[-1], vh->flags, vh->csum_start, vh->csum_offset, late,
				 late_errno);
		}
		for (unsigned i = 0; i < n; i++) {
			unsigned char *m = (unsigned char *)h + h->tp_mac;
			unsigned len = h->tp_snaplen;
			if (len != h->tp_len)
				trunc++;
			if (len < 14 || m[12] != (ETYPE >> 8) || m[13] != (ETYPE & 0xff))
				bad++;
			if (h->tp_status & TP_STATUS_VLAN_VALID)
				vlan++;
			/* the daemon needs the frame in its own buffer: copy vnet hdr + frame */
			memcpy(bufs[k++ & (NBUF - 1)], m - hoff, len + hoff);
			bytes += len;
			h = (void *)((char *)h + h->tp_next_offset);
		}
		frames += n;
		blocks++;
		__atomic_store_n(&bd->hdr.bh1.block_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
		bi = (bi + 1) % blk_nr;
		if (n)
			t_last = t;
		if (t - tstart > maxsecs)
			break;
	}
	double c1 = cpu_s();
	unsigned freeze;
	unsigned drops = stats(fd, NULL, &freeze);
	char more[400];
	snprintf(more, sizeof(more), "blocks=%lu trunc=%lu vlan=%lu %s", blocks, trunc, vlan, vinfo);
	report("rx-ring", frames, bytes, t_first, t_last, c0, c1, drops, freeze, bad, calls, more);
}

/* ---------------- TX: sendmmsg ---------------- */
static void tx_mmsg(void)
{
	int fd = open_sock(0);
	set_vnet(fd);
	bind_sock(fd, 0);	/* protocol 0: this socket receives nothing */
	alloc_bufs();
	struct mmsghdr *mm = calloc(batch, sizeof(*mm));
	struct iovec *iov = calloc(batch, sizeof(*iov));
	int flen = 0;
	for (int i = 0; i < batch; i++) {
		flen = build_frame(bufs[i % NBUF], i);
		iov[i].iov_base = bufs[i % NBUF];
		iov[i].iov_len = flen;
		mm[i].msg_hdr.msg_iov = &iov[i];
		mm[i].msg_hdr.msg_iovlen = 1;
	}
	signal(SIGALRM, on_alarm);
	unsigned long frames = 0, calls = 0, errs = 0;
	double t0 = now(), c0 = cpu_s();
	alarm(secs);
	unsigned seq = 0;
	int eoff = (vnet_ok == 1) ? VNET_SZ : 0;
	while (!stop) {
		if (seqchk) {
			unsigned s0 = seq;
			for (int i = 0; i < batch; i++, s0++)
				memcpy((char *)iov[i].iov_base + eoff + fsize - 4, &s0, 4);
		}
		int n = sendmmsg(fd, mm, batch, 0);
		if (n > 0)
			seq += n;
		calls++;
		if (n < 0) {
			if (errno == EINTR)
				break;
			errs++;
			if (errs < 5)
				fprintf(stderr, "sendmmsg: %s\n", strerror(errno));
			if (errno != ENOBUFS && errno != EAGAIN)
				die("sendmmsg");
			continue;
		}
		frames += n;
	}
	double t1 = now(), c1 = cpu_s();
	char more[64];
	snprintf(more, sizeof(more), "errs=%lu", errs);
	report("tx-mmsg", frames, frames * (unsigned long)fsize, t0, t1, c0, c1, 0, 0, 0, calls, more);
}

/* ---------------- TX: TPACKET_V3 / V2 ring ---------------- */
static void tx_ring(void)
{
	int fd = open_sock(0);
	int v = txver == 3 ? TPACKET_V3 : TPACKET_V2;
	if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v, sizeof(v)) < 0)
		die("PACKET_VERSION");
	set_vnet(fd);
	int hdrlen = txver == 3 ? TPACKET3_HDRLEN : TPACKET2_HDRLEN;
	int data_off = hdrlen - (int)sizeof(struct sockaddr_ll);
	/* frame slot: header + vnet + 64 KiB, 16-byte aligned */
	unsigned fs = TPACKET_ALIGN(data_off + VNET_SZ + BUFSZ);
	unsigned per_blk = blk_sz / fs;
	unsigned nblk = (txframes + per_blk - 1) / per_blk;
	struct tpacket_req3 req = {0};
	req.tp_block_size = blk_sz;
	req.tp_block_nr = nblk;
	req.tp_frame_size = fs;
	req.tp_frame_nr = nblk * per_blk;
	if (setsockopt(fd, SOL_PACKET, PACKET_TX_RING, &req,
		       txver == 3 ? sizeof(struct tpacket_req3) : sizeof(struct tpacket_req)) < 0)
		die("PACKET_TX_RING");
	unsigned nframes = req.tp_frame_nr;
	char *ring = mmap(NULL, (size_t)blk_sz * nblk, PROT_READ | PROT_WRITE,
			  MAP_SHARED | MAP_POPULATE, fd, 0);
	if (ring == MAP_FAILED)
		die("mmap");
	bind_sock(fd, 0);
	alloc_bufs();
	int flen = 0;
	for (int i = 0; i < NBUF; i++)
		flen = build_frame(bufs[i], i);
	/* pre-build frames in the ring too (used when txcopy == 0) */
	for (unsigned i = 0; i < nframes; i++) {
		char *f = ring + (size_t)(i / per_blk) * blk_sz + (size_t)(i % per_blk) * fs;
		memcpy(f + data_off, bufs[i % NBUF], flen);
	}
	signal(SIGALRM, on_alarm);
	unsigned long frames = 0, calls = 0, waits = 0, wrong = 0;
	unsigned idx = 0;
	double t0 = now(), c0 = cpu_s();
	alarm(secs);
	while (!stop) {
		for (int j = 0; j < batch; j++) {
			char *f = ring + (size_t)(idx / per_blk) * blk_sz + (size_t)(idx % per_blk) * fs;
			volatile __u32 *st = txver == 3 ? &((struct tpacket3_hdr *)f)->tp_status
						       : &((struct tpacket2_hdr *)f)->tp_status;
			unsigned s;
			while ((s = __atomic_load_n(st, __ATOMIC_ACQUIRE)) &
			       (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING)) {
				struct pollfd pfd = {.fd = fd, .events = POLLOUT};
				waits++;
				send(fd, NULL, 0, MSG_DONTWAIT);
				poll(&pfd, 1, 10);
				if (stop)
					break;
			}
			if (s & TP_STATUS_WRONG_FORMAT)
				wrong++;
			if (txcopy)
				memcpy(f + data_off, bufs[idx % NBUF], flen);
			if (seqchk) {
				unsigned sq = frames + j;
				memcpy(f + data_off + (vnet_ok == 1 ? VNET_SZ : 0) + fsize - 4, &sq, 4);
			}
			if (txver == 3) {
				struct tpacket3_hdr *h = (void *)f;
				h->tp_len = flen;
				h->tp_snaplen = flen;
				h->tp_next_offset = 0;
			} else {
				struct tpacket2_hdr *h = (void *)f;
				h->tp_len = flen;
				h->tp_snaplen = flen;
			}
			__atomic_store_n(st, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
			idx = (idx + 1) % nframes;
		}
		/* one kick per batch; blocking by default, MSG_DONTWAIT with -k */
		int r = send(fd, NULL, 0, kick_nb ? MSG_DONTWAIT : 0);
		calls++;
		if (r < 0) {
			if (errno == EINTR)
				break;
			if (errno == EAGAIN || errno == ENOBUFS)
				continue;
			die("send(kick)");
		}
		/* kernel returns the sum of tp_len minus the vnet header */
		int per = vnet_ok == 1 ? flen - VNET_SZ : flen;
		frames += r / per;
		if (r % per)
			fprintf(stderr, "odd send ret %d\n", r);
	}
	double t1 = now(), c1 = cpu_s();
	char more[128];
	snprintf(more, sizeof(more), "kick_nb=%d txver=%d waits=%lu wrong_format=%lu slot=%u nframes=%u", kick_nb, txver,
		 waits, wrong, fs, nframes);
	report("tx-ring", frames, frames * (unsigned long)fsize, t0, t1, c0, c1, 0, 0, 0, calls, more);
}

int main(int argc, char **argv)
{
	int c;
	while ((c = getopt(argc, argv, "i:s:t:b:n:B:N:T:V:F:r:I:M:aCxkS")) != -1) {
		switch (c) {
		case 'i': ifname = optarg; break;
		case 's': fsize = atoi(optarg); break;
		case 't': secs = atoi(optarg); break;
		case 'b': batch = atoi(optarg); break;
		case 'B': blk_sz = atoi(optarg); break;
		case 'N': blk_nr = atoi(optarg); break;
		case 'T': tov = atoi(optarg); break;
		case 'V': txver = atoi(optarg); break;
		case 'F': txframes = atoi(optarg); break;
		case 'r': rcvbuf = atoi(optarg); break;
		case 'I': idle_ms = atoi(optarg); break;
		case 'M': maxsecs = atoi(optarg); break;
		case 'n': vnet = atoi(optarg); break;	/* -n 0 disables vnet hdr */
		case 'a': aux = 0; break;
		case 'C': csum = 1; break;
		case 'x': txcopy = 0; break;
		case 'k': kick_nb = 1; break;
		case 'S': seqchk = 1; break;
		default: fprintf(stderr, "bad opt\n"); return 2;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "usage: %s [opts] rx-mmsg|rx-ring|tx-mmsg|tx-ring\n", argv[0]);
		return 2;
	}
	mode = argv[optind];
	if (!strcmp(mode, "rx-mmsg")) rx_mmsg();
	else if (!strcmp(mode, "rx-ring")) rx_ring();
	else if (!strcmp(mode, "tx-mmsg")) tx_mmsg();
	else if (!strcmp(mode, "tx-ring")) tx_ring();
	else { fprintf(stderr, "unknown mode\n"); return 2; }
	return 0;
}
