/*
 * libFuzzer target for what the cluster-aware Redis client reads from a cluster's
 * answers (core/src/io/tg_redis_cluster.c): MOVED / ASK error strings and the slot map
 * from a CLUSTER SHARDS or CLUSTER SLOTS reply.
 *
 * Input: the first byte picks the reader (0: an error string; odd: CLUSTER SHARDS;
 * even: CLUSTER SLOTS), the rest is that error's text or RESP bytes, parsed by hiredis's
 * reader as the client's socket would be. Invariants: never a crash or a read outside
 * the input (ASan); a redirection names a slot below 16384, a port in 1..65535 and a
 * host that fits; a map's every slot is -1 or a node it lists, `covered` counts them,
 * and its nodes have a port in range.
 */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_redis_cluster.h"

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_redis_cluster invariant failed: %s\n", what);
        abort();
    }
}

static tg_redis_slotmap_t map;

/* Whether an array header in the RESP bytes claims more elements than the input has
 * bytes: no reply the client reads can, and hiredis 0.14's reader (Debian 12; it has no
 * maxelements) allocates the element array from the header alone — a 4 GB malloc is the
 * library's, not the slot map reader's. Any '*' counts, not only one that starts a line:
 * a bulk string's length decides where the reader takes the next type byte, so a header
 * may follow any byte (the fuzzer found "…0*488634854\r\n" right after a bulk string's
 * data; corpus/fuzz_redis_cluster/huge-array-mid-line). */
static int huge_array(const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (b[i] != '*')
            continue;
        size_t v = 0, k = i + 1;
        while (k < n && b[k] >= '0' && b[k] <= '9' && v <= n)
            v = v * 10 + (size_t)(b[k++] - '0');
        if (v > n)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int mode = data[0];
    size--;
    char *buf = malloc(size ? size : 1); /* exactly `size` bytes: ASan sees a read past the end */
    memcpy(buf, data + 1, size);
    if (mode == 0) {
        char host[TG_REDIS_HOST_MAX];
        int slot = -1, port = -1;
        int kind = tg_redis_parse_redirect(buf, size, &slot, host, &port);
        if (kind != TG_REDIS_REDIRECT_NONE) {
            check(kind == TG_REDIS_REDIRECT_MOVED || kind == TG_REDIS_REDIRECT_ASK, "kind");
            check(slot >= 0 && slot < TG_REDIS_SLOTS, "slot in range");
            check(port > 0 && port <= 65535, "port in range");
            check(strlen(host) < TG_REDIS_HOST_MAX, "host fits");
        }
    } else if (!huge_array(buf, size)) {
        redisReader *rd = redisReaderCreate();
        redisReaderFeed(rd, buf, size);
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) == REDIS_OK && reply) {
            int n = tg_redis_slotmap_parse(reply, mode & 1, &map);
            if (n > 0) {
                int covered = 0;
                check(map.nnodes > 0 && map.nnodes <= TG_REDIS_NODES_MAX, "node count");
                for (int s = 0; s < TG_REDIS_SLOTS; s++) {
                    check(map.slot[s] >= -1 && map.slot[s] < map.nnodes, "slot names a listed node");
                    covered += map.slot[s] >= 0;
                }
                check(covered == n && covered == map.covered, "covered counts the slots");
                for (int i = 0; i < map.nnodes; i++)
                    check(map.nodes[i].port > 0 && map.nodes[i].port <= 65535, "node port in range");
            } else {
                check(n == -1, "-1 or a count");
            }
            freeReplyObject(reply);
        }
        redisReaderFree(rd);
    }
    free(buf);
    return 0;
}
