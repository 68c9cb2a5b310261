/* SPDX-License-Identifier: MIT */
/*
 * The fake GPU daemon of the Python tests: the daemon's real GPU module
 * (gpu_register(), gpu_mr_plan()) behind the minimal protocol server of
 * gpu_server.h, run with LD_LIBRARY_PATH naming the fake libcuda
 * (fake-libcuda.c), so that rdmax_region_register_gpu() goes end to end
 * without a GPU or an RDMA NIC. dma-bufs of the fake driver are memfds,
 * which this program accepts in place of the real dma-buf check.
 *
 * Prints "socket PATH" once listening, then a line per registration,
 * refusal and deregistration; exits when its one client leaves (0), or 1
 * when the server cannot start.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_server.h"

/* The fake driver's dma-bufs are memfds: their size is what an export gives. */
static int memfd_size(int fd, uint64_t *ret_size)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		return -errno;
	}
	*ret_size = (uint64_t)st.st_size;
	return 0;
}

int main(void)
{
	struct server srv;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (gpu_server_start(&srv, "fake-gpu", memfd_size, stdout) < 0) {
		fprintf(stderr, "fake-gpu-daemon: cannot start: %s\n", strerror(errno));
		return 1;
	}
	printf("socket %s\n", srv.path);
	pthread_join(srv.thread, NULL);
	unlink(srv.path);
	rmdir(srv.dir);
	return 0;
}
