/*
 * Redis Cluster's pieces that need no connection, for the client (tg_redis.c) and
 * `tollgate ledger`: the key's slot (CRC16 of the key or of its hash tag, mod 16384),
 * a MOVED or ASK error taken apart, and the slot map read from a CLUSTER SHARDS or
 * CLUSTER SLOTS reply. Pure functions: no allocation but the map's own.
 */
#ifndef TOLLGATE_TG_REDIS_CLUSTER_H
#define TOLLGATE_TG_REDIS_CLUSTER_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#define TG_REDIS_SLOTS 16384
/** The most distinct primaries a map names; a larger cluster is refused (logged). */
#define TG_REDIS_NODES_MAX 64
#define TG_REDIS_HOST_MAX 256

/** CRC16/XMODEM (polynomial 0x1021, initial value 0), the cluster's key hash. */
uint16_t tg_redis_crc16(const char *p, size_t len);

/** The slot of a key: of the text between its first '{' and the next '}' when that is
 *  not empty, else of the whole key. */
int tg_redis_key_slot(const char *key, size_t len);

/** The first key of a command (argv[1] for a plain command; for EVAL / EVALSHA /
 *  FCALL the first of numkeys keys), or -1 when it has none: *key, *len set. */
int tg_redis_command_key(int argc, const char **argv, const size_t *argvlen, const char **key, size_t *len);

enum { TG_REDIS_REDIRECT_NONE = 0, TG_REDIS_REDIRECT_MOVED, TG_REDIS_REDIRECT_ASK };

/** "MOVED <slot> <host>:<port>" or "ASK ...": the kind, the slot and the node (an empty
 *  host, as a node without a known address announces it, leaves host ""). Anything
 *  else, or a malformed one, is TG_REDIS_REDIRECT_NONE. */
int tg_redis_parse_redirect(const char *err, size_t len, int *slot, char host[TG_REDIS_HOST_MAX], int *port);

/** A slot map: for each slot the index of its primary in `nodes`, or -1 (unserved). */
typedef struct tg_redis_slotmap_s {
    struct {
        char host[TG_REDIS_HOST_MAX]; /* "" : the node that answered */
        int port;
    } nodes[TG_REDIS_NODES_MAX];
    int nnodes;
    int16_t slot[TG_REDIS_SLOTS];
    int covered; /* slots that have a primary */
    int tls;     /* in: the client talks TLS, so a node's "tls-port" comes first (CLUSTER SHARDS
                  * names both when a node serves both; a TLS-only node has no "port") */
} tg_redis_slotmap_t;

/**
 * Fills *m from a CLUSTER SHARDS reply (shards = 1; each shard's primary is its node with
 * role "master" whose health is not "fail"/"failed") or a CLUSTER SLOTS reply (shards =
 * 0; the first node of each range). Returns the number of covered slots (> 0), or -1
 * when the reply is not such a map (*m then unusable).
 */
int tg_redis_slotmap_parse(const redisReply *rep, int shards, tg_redis_slotmap_t *m);

#endif
