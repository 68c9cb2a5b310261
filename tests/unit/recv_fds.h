/* SPDX-License-Identifier: MIT */
/*
 * Receive one datagram of a SOCK_SEQPACKET socket with the fds it carries
 * (SCM_RIGHTS), as the daemon's stand-ins in the GPU unit tests and the
 * device check do. Header only: both link it without a common library.
 */
#ifndef RDMAX_TEST_RECV_FDS_H
#define RDMAX_TEST_RECV_FDS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#define TEST_RECV_FDS_MAX 8

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
