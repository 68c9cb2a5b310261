/* SPDX-License-Identifier: MIT */
/*
 * File descriptors over a Unix socket (SCM_RIGHTS) for the test programs:
 * a message that carries one fd, as test clients send to the daemon, and
 * one datagram received with the fds it carries, as the daemon's stand-ins
 * in the GPU unit tests and the device check do. Header only: the unit
 * tests, the fuzzers and the device check link no common test library.
 */
#ifndef RDMAX_TEST_PASS_FDS_H
#define RDMAX_TEST_PASS_FDS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#define TEST_RECV_FDS_MAX 8

/* Control data with room for one fd. */
union test_fd_control {
	char buf[CMSG_SPACE(sizeof(int))];
	struct cmsghdr align;
};

/* Make mh carry fd (SCM_RIGHTS), with ctl as its control data. */
static inline void test_attach_fd(struct msghdr *mh, union test_fd_control *ctl, int fd)
{
	memset(ctl, 0, sizeof(*ctl));
	mh->msg_control = ctl->buf;
	mh->msg_controllen = sizeof(ctl->buf);
	struct cmsghdr *c = CMSG_FIRSTHDR(mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
}

/*
 * \return the datagram's length (0 or less: the peer left or an error), with
 *         up to TEST_RECV_FDS_MAX fds in fds[] and their number in *ret_n_fds
 */
static inline ssize_t test_recv_fds(int sock, void *buf, size_t size, int *fds, int *ret_n_fds)
{
	union {
		char buf[CMSG_SPACE(TEST_RECV_FDS_MAX * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = size};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.buf,
			    .msg_controllen = sizeof(ctl.buf)};
	ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	int n_fds = 0;

	for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k && n_fds < TEST_RECV_FDS_MAX; i++) {
				memcpy(&fds[n_fds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			}
		}
	}
	*ret_n_fds = n_fds;
	return n;
}

#endif
