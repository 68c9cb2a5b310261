/* SPDX-License-Identifier: MIT */
/*
 * rdmax-bench: the entry point, the usage text and the options of serve, run
 * and local (sizes, window, batch, iterations, output); kv parses its own
 * options in kv.c. Runs no transfer itself: it hands the parsed options to
 * the responder, the requester or kv.
 */
#include "bench.h"

int bench_parse_size(const char *s, uint64_t *ret_size)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	uint64_t mult = 1;

	if (errno || end == s) {
		return -EINVAL;
	}
	switch (*end) {
	case 'k':
	case 'K':
		mult = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mult = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mult = 1ull << 30;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' || *end == 'I') {
		end++;
	}
	if (*end == 'b' || *end == 'B') {
		end++;
	}
	if (*end != '\0' || v == 0 || v > UINT64_MAX / mult) {
		return -EINVAL;
	}
	*ret_size = v * mult;
	return 0;
}

static int parse_sizes(struct opts *o, const char *list)
{
	char *dup = strdup(list);
	char *save = NULL;
	int ret = 0;

	if (!dup) {
		return -ENOMEM;
	}
	o->n_sizes = 0;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->n_sizes == MAX_SIZES || bench_parse_size(tok, &o->sizes[o->n_sizes]) < 0) {
			fprintf(stderr, "rdmax-bench: bad size '%s' (at most %d sizes)\n", tok,
				MAX_SIZES);
			ret = -EINVAL;
			break;
		}
		o->n_sizes++;
	}
	free(dup);
	return ret;
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: rdmax-bench serve --socket PATH --desc FILE|- [--size BYTES] [--stop-file "
		"FILE]\n"
		"       rdmax-bench run   --socket PATH (--desc FILE | --desc-hex HEX) [OPTIONS]\n"
		"       rdmax-bench local --socket PATH [OPTIONS]\n"
		"\n"
		"serve: register a region (remote read+write), publish its descriptor to FILE\n"
		"       (atomically) or as hex on stdout (-), wait for SIGTERM/SIGINT or FILE.\n"
		"run:   jobs against a published region. local: two clients of one daemon (the\n"
		"       daemon copies locally) against memcpy of the same sizes.\n"
		"\n"
		"  -o, --op OP          write | read | paged | paged_read | scatter (default "
		"write)\n"
		"  -a, --all            sizes 2 B .. 8 MiB, powers of two\n"
		"  -s, --sizes LIST     comma-separated sizes, K/M/G suffixes (default 64K)\n"
		"  -w, --window N       outstanding jobs (default %u)\n"
		"  -b, --batch N        jobs per rdmax_submit() (default 1)\n"
		"  -n, --iters N        jobs per size (default %u, at most 1 GiB per size)\n"
		"  -D, --duration SECS  run each size this long instead of -n\n"
		"      --warmup N       untimed jobs before each size (default %u)\n"
		"      --page-len BYTES paged, paged_read: bytes per page (default 16K); "
		"destination\n"
		"                       pages are the source pages in reverse order (a block "
		"table)\n"
		"      --dests N        scatter: destinations per job, equal slices (default 4)\n"
		"      --imm VALUE      writes carry this immediate value\n"
		"      --lat            latency mode: window 1, batch 1\n"
		"      --no-ring        jobs and completions over the socket, not the "
		"shared-memory\n"
		"                       ring (sets RDMAX_RING=0 for this process)\n"
		"      --no-verify      skip the read-back check after each size\n"
		"      --daemon-pid PID the local daemon (default: SO_PEERCRED of the socket)\n"
		"      --peer-daemon-pid PID  also report the peer daemon's CPU time\n"
		"      --label TEXT     copied into the JSON\n"
		"      --json[=FILE]    JSON to stdout (table suppressed) or to FILE\n",
		DEFAULT_WINDOW, DEFAULT_ITERS, DEFAULT_WARMUP);
}

int bench_parse_u64(const char *s, uint64_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || *end) {
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	enum {
		OPT_WARMUP = 256,
		OPT_IMM,
		OPT_LAT,
		OPT_NO_RING,
		OPT_NO_VERIFY,
		OPT_DAEMON_PID,
		OPT_PEER_PID,
		OPT_LABEL,
		OPT_JSON,
		OPT_DESC_HEX,
		OPT_STOP_FILE,
		OPT_SIZE,
		OPT_PAGE_LEN,
		OPT_DESTS,
	};
	static const struct option options[] = {
		{"socket", required_argument, NULL, 'S'},
		{"desc", required_argument, NULL, 'd'},
		{"desc-hex", required_argument, NULL, OPT_DESC_HEX},
		{"stop-file", required_argument, NULL, OPT_STOP_FILE},
		{"size", required_argument, NULL, OPT_SIZE},
		{"op", required_argument, NULL, 'o'},
		{"all", no_argument, NULL, 'a'},
		{"sizes", required_argument, NULL, 's'},
		{"window", required_argument, NULL, 'w'},
		{"batch", required_argument, NULL, 'b'},
		{"iters", required_argument, NULL, 'n'},
		{"duration", required_argument, NULL, 'D'},
		{"warmup", required_argument, NULL, OPT_WARMUP},
		{"imm", required_argument, NULL, OPT_IMM},
		{"lat", no_argument, NULL, OPT_LAT},
		{"no-ring", no_argument, NULL, OPT_NO_RING},
		{"no-verify", no_argument, NULL, OPT_NO_VERIFY},
		{"daemon-pid", required_argument, NULL, OPT_DAEMON_PID},
		{"peer-daemon-pid", required_argument, NULL, OPT_PEER_PID},
		{"label", required_argument, NULL, OPT_LABEL},
		{"page-len", required_argument, NULL, OPT_PAGE_LEN},
		{"dests", required_argument, NULL, OPT_DESTS},
		{"json", optional_argument, NULL, OPT_JSON},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool window_set = false, batch_set = false;
	uint64_t v;
	int opt;

	if (argc < 2) {
		usage(stderr);
		return -EINVAL;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(stdout);
		exit(0);
	}
	if (strcmp(argv[1], "serve") == 0) {
		o->mode = MODE_SERVE;
	} else if (strcmp(argv[1], "run") == 0) {
		o->mode = MODE_RUN;
	} else if (strcmp(argv[1], "local") == 0) {
		o->mode = MODE_LOCAL;
	} else {
		fprintf(stderr, "rdmax-bench: unknown mode '%s' (serve, run or local)\n", argv[1]);
		return -EINVAL;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "S:d:o:as:w:b:n:D:h", options, NULL)) != -1) {
		switch (opt) {
		case 'S':
			o->socket_path = optarg;
			break;
		case 'd':
			o->desc_path = optarg;
			break;
		case OPT_DESC_HEX:
			o->desc_hex = optarg;
			break;
		case OPT_STOP_FILE:
			o->stop_file = optarg;
			break;
		case OPT_SIZE:
			if (bench_parse_size(optarg, &o->serve_bytes) < 0) {
				fprintf(stderr, "rdmax-bench: bad --size '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case 'o':
			o->op_name = optarg;
			if (strcmp(optarg, "write") == 0) {
				o->op = RDMAX_OP_WRITE;
			} else if (strcmp(optarg, "read") == 0) {
				o->op = RDMAX_OP_READ;
			} else if (strcmp(optarg, "paged") == 0 ||
				   strcmp(optarg, "paged_write") == 0) {
				o->op = RDMAX_OP_PAGED_WRITE;
			} else if (strcmp(optarg, "paged_read") == 0) {
				o->op = RDMAX_OP_PAGED_READ;
			} else if (strcmp(optarg, "scatter") == 0) {
				o->op = RDMAX_OP_SCATTER;
			} else {
				fprintf(stderr,
					"rdmax-bench: unknown op '%s' (write, read, paged, "
					"paged_read, scatter)\n",
					optarg);
				return -EINVAL;
			}
			break;
		case 'a':
			o->n_sizes = 0;
			for (uint64_t s = SWEEP_MIN; s <= SWEEP_MAX; s *= 2) {
				o->sizes[o->n_sizes++] = s;
			}
			break;
		case 's':
			if (parse_sizes(o, optarg) < 0) {
				return -EINVAL;
			}
			break;
		case 'w':
			if (bench_parse_u64(optarg, &v) < 0 || v == 0 || v > 1048576) {
				fprintf(stderr, "rdmax-bench: bad window '%s'\n", optarg);
				return -EINVAL;
			}
			o->window = (uint32_t)v;
			window_set = true;
			break;
		case 'b':
			if (bench_parse_u64(optarg, &v) < 0 || v == 0 || v > 65536) {
				fprintf(stderr, "rdmax-bench: bad batch '%s'\n", optarg);
				return -EINVAL;
			}
			o->batch = (uint32_t)v;
			batch_set = true;
			break;
		case 'n':
			if (bench_parse_u64(optarg, &o->iters) < 0 || o->iters == 0) {
				fprintf(stderr, "rdmax-bench: bad iteration count '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case 'D': {
			char *end;
			o->duration_s = strtod(optarg, &end);
			if (*end || !(o->duration_s > 0 && o->duration_s < 3600)) {
				fprintf(stderr, "rdmax-bench: bad duration '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		}
		case OPT_WARMUP:
			if (bench_parse_u64(optarg, &v) < 0 || v > 1000000) {
				fprintf(stderr, "rdmax-bench: bad warm-up count '%s'\n", optarg);
				return -EINVAL;
			}
			o->warmup = (uint32_t)v;
			break;
		case OPT_IMM:
			if (bench_parse_u64(optarg, &v) < 0 || v > UINT32_MAX) {
				fprintf(stderr, "rdmax-bench: bad imm '%s'\n", optarg);
				return -EINVAL;
			}
			o->has_imm = true;
			o->imm = (uint32_t)v;
			break;
		case OPT_LAT:
			o->lat = true;
			break;
		case OPT_NO_RING:
			o->no_ring = true;
			setenv("RDMAX_RING", "0", 1);
			break;
		case OPT_NO_VERIFY:
			o->verify = false;
			break;
		case OPT_DAEMON_PID:
		case OPT_PEER_PID:
			if (bench_parse_u64(optarg, &v) < 0 || v == 0 || v > INT32_MAX) {
				fprintf(stderr, "rdmax-bench: bad pid '%s'\n", optarg);
				return -EINVAL;
			}
			*(opt == OPT_DAEMON_PID ? &o->daemon_pid : &o->peer_pid) = (int)v;
			break;
		case OPT_LABEL:
			o->label = optarg;
			break;
		case OPT_PAGE_LEN:
			if (bench_parse_size(optarg, &o->page_len) < 0) {
				fprintf(stderr, "rdmax-bench: bad --page-len '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case OPT_DESTS:
			if (bench_parse_u64(optarg, &v) < 0 || v == 0 || v > 4096) {
				fprintf(stderr, "rdmax-bench: bad --dests '%s'\n", optarg);
				return -EINVAL;
			}
			o->dests = (uint32_t)v;
			break;
		case OPT_JSON:
			o->json = true;
			o->json_path = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "rdmax-bench: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (o->mode == MODE_SERVE && !o->desc_path) {
		fprintf(stderr, "rdmax-bench: serve needs --desc FILE or --desc -\n");
		return -EINVAL;
	}
	if (o->mode == MODE_RUN && !o->desc_path == !o->desc_hex) {
		fprintf(stderr, "rdmax-bench: run needs one of --desc FILE and --desc-hex HEX\n");
		return -EINVAL;
	}
	if (o->lat) {
		if ((window_set && o->window != 1) || (batch_set && o->batch != 1)) {
			fprintf(stderr, "rdmax-bench: --lat runs with window 1 and batch 1\n");
			return -EINVAL;
		}
		o->window = 1;
		o->batch = 1;
	}
	if (o->batch > o->window) {
		if (batch_set && window_set) {
			fprintf(stderr, "rdmax-bench: batch %u exceeds window %u\n", o->batch,
				o->window);
			return -EINVAL;
		}
		o->window = o->batch;
	}
	if (o->iters && o->duration_s > 0) {
		fprintf(stderr, "rdmax-bench: -n and -D exclude each other\n");
		return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = {
		.op = RDMAX_OP_WRITE,
		.op_name = "write",
		.serve_bytes = DEFAULT_SERVE_BYTES,
		.window = DEFAULT_WINDOW,
		.batch = 1,
		.warmup = DEFAULT_WARMUP,
		.verify = true,
		.page_len = 16 << 10,
		.dests = 4,
		.n_sizes = 1,
		.sizes = {64 << 10},
	};

	if (argc > 1 && strcmp(argv[1], "pairs") == 0) {
		signal(SIGPIPE, SIG_IGN);
		signal(SIGTERM, bench_on_stop_signal);
		return bench_pairs_main(argc - 1, argv + 1);
	}
	if (argc > 1 && strcmp(argv[1], "kv") == 0) {
		signal(SIGPIPE, SIG_IGN);
		signal(SIGTERM, bench_on_stop_signal);
		return bench_kv_main(argc - 1, argv + 1);
	}
	if (parse_args(argc, argv, &o) < 0) {
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (o.mode == MODE_SERVE) {
		return bench_run_serve(&o);
	}
	return bench_run_requester(&o);
}
