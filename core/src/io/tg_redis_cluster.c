/*
 * Redis Cluster's connection-free pieces (see tg_redis_cluster.h): key slots, MOVED /
 * ASK errors, and the slot map from CLUSTER SHARDS or CLUSTER SLOTS. Everything read
 * from a reply is checked: a server's answer is trusted for nothing but its shape.
 */
#include "tollgate/tg_redis_cluster.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

uint16_t tg_redis_crc16(const char *p, size_t len) {
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

int tg_redis_key_slot(const char *key, size_t len) {
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return tg_redis_crc16(open + 1, (size_t)(close - open - 1)) & (TG_REDIS_SLOTS - 1);
    }
    return tg_redis_crc16(key, len) & (TG_REDIS_SLOTS - 1);
}

static size_t arg_len(const char **argv, const size_t *argvlen, int i) {
    return argvlen ? argvlen[i] : strlen(argv[i]);
}

/* argv[i] is `word`, case-insensitively. */
static int arg_is(const char **argv, const size_t *argvlen, int i, const char *word) {
    size_t n = strlen(word);
    return arg_len(argv, argvlen, i) == n && strncasecmp(argv[i], word, n) == 0;
}

int tg_redis_command_key(int argc, const char **argv, const size_t *argvlen, const char **key, size_t *len) {
    if (argc < 2)
        return -1;
    int at = 1;
    if (arg_is(argv, argvlen, 0, "EVALSHA") || arg_is(argv, argvlen, 0, "EVAL") ||
        arg_is(argv, argvlen, 0, "FCALL") || arg_is(argv, argvlen, 0, "EVAL_RO") ||
        arg_is(argv, argvlen, 0, "EVALSHA_RO")) {
        if (argc < 4)
            return -1;
        char n[8];
        size_t l = arg_len(argv, argvlen, 2);
        if (l == 0 || l >= sizeof(n))
            return -1;
        memcpy(n, argv[2], l);
        n[l] = '\0';
        if (atoi(n) <= 0)
            return -1;
        at = 3;
    }
    *key = argv[at];
    *len = arg_len(argv, argvlen, at);
    return 0;
}

int tg_redis_parse_redirect(const char *err, size_t len, int *slot, char host[TG_REDIS_HOST_MAX], int *port) {
    int kind;
    size_t off;
    if (len > 6 && memcmp(err, "MOVED ", 6) == 0)
        kind = TG_REDIS_REDIRECT_MOVED, off = 6;
    else if (len > 4 && memcmp(err, "ASK ", 4) == 0)
        kind = TG_REDIS_REDIRECT_ASK, off = 4;
    else
        return TG_REDIS_REDIRECT_NONE;
    /* the slot: 1 to 5 digits, below 16384 */
    long s = 0;
    size_t d = 0;
    while (off < len && err[off] >= '0' && err[off] <= '9' && d < 6)
        s = s * 10 + (err[off++] - '0'), d++;
    if (d == 0 || d > 5 || s >= TG_REDIS_SLOTS || off >= len || err[off] != ' ')
        return TG_REDIS_REDIRECT_NONE;
    off++;
    /* host:port, split at the last ':' (an IPv6 address has more) */
    const char *ep = err + off;
    size_t elen = len - off;
    const char *colon = NULL;
    for (size_t i = 0; i < elen; i++) {
        if (ep[i] == ':')
            colon = ep + i;
        else if (ep[i] == ' ' || ep[i] == '\0' || ep[i] == '\r' || ep[i] == '\n')
            return TG_REDIS_REDIRECT_NONE;
    }
    if (!colon)
        return TG_REDIS_REDIRECT_NONE;
    size_t hlen = (size_t)(colon - ep);
    const char *pp = colon + 1, *pend = ep + elen;
    long p = 0;
    if (pp == pend || pend - pp > 5)
        return TG_REDIS_REDIRECT_NONE;
    for (; pp < pend; pp++) {
        if (*pp < '0' || *pp > '9')
            return TG_REDIS_REDIRECT_NONE;
        p = p * 10 + (*pp - '0');
    }
    if (p <= 0 || p > 65535 || hlen >= TG_REDIS_HOST_MAX)
        return TG_REDIS_REDIRECT_NONE;
    /* "[::1]:7000" as some proxies write it */
    if (hlen >= 2 && ep[0] == '[' && ep[hlen - 1] == ']')
        ep++, hlen -= 2;
    memcpy(host, ep, hlen);
    host[hlen] = '\0';
    *slot = (int)s;
    *port = (int)p;
    return kind;
}

/* ---- the slot map ----------------------------------------------------------------- */

static int rep_is_str(const redisReply *r) {
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->str;
}

static int rep_eq(const redisReply *r, const char *s) {
    return rep_is_str(r) && r->len == strlen(s) && memcmp(r->str, s, r->len) == 0;
}

/* An integer, or a string of digits (CLUSTER SHARDS has sent both); -1 otherwise. */
static long long rep_int(const redisReply *r) {
    if (!r)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (!rep_is_str(r) || r->len == 0 || r->len > 18)
        return -1;
    long long v = 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->str[i] < '0' || r->str[i] > '9')
            return -1;
        v = v * 10 + (r->str[i] - '0');
    }
    return v;
}

/* The node's index in m, added when new; -1 when the map is full or the address bad. */
static int map_node(tg_redis_slotmap_t *m, const char *host, size_t hlen, long long port) {
    if (port <= 0 || port > 65535 || hlen >= TG_REDIS_HOST_MAX || memchr(host, '\0', hlen))
        return -1;
    for (int i = 0; i < m->nnodes; i++)
        if (m->nodes[i].port == port && strlen(m->nodes[i].host) == hlen && memcmp(m->nodes[i].host, host, hlen) == 0)
            return i;
    if (m->nnodes == TG_REDIS_NODES_MAX)
        return -1;
    memcpy(m->nodes[m->nnodes].host, host, hlen);
    m->nodes[m->nnodes].host[hlen] = '\0';
    m->nodes[m->nnodes].port = (int)port;
    return m->nnodes++;
}

static int map_range(tg_redis_slotmap_t *m, long long from, long long to, int node) {
    if (from < 0 || to < from || to >= TG_REDIS_SLOTS)
        return -1;
    for (long long s = from; s <= to; s++) {
        if (m->slot[s] < 0)
            m->covered++;
        m->slot[s] = (int16_t)node;
    }
    return 0;
}

/* A flat map array ["k", v, "k", v, ...]: the value of `name`, or NULL. */
static const redisReply *field(const redisReply *r, const char *name) {
    if (!r || r->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < r->elements; i += 2)
        if (rep_eq(r->element[i], name))
            return r->element[i + 1];
    return NULL;
}

/* A node's address in a CLUSTER SHARDS entry: its endpoint unless that is "?" or
 * empty, else its ip. */
static int shard_node(tg_redis_slotmap_t *m, const redisReply *n) {
    const redisReply *ep = field(n, "endpoint"), *ip = field(n, "ip");
    const redisReply *a = rep_is_str(ep) && ep->len > 0 && !rep_eq(ep, "?") ? ep : ip;
    if (!rep_is_str(a))
        return -1;
    const redisReply *port = field(n, "port"), *tls_port = field(n, "tls-port");
    return map_node(m, a->str, a->len, rep_int((m->tls && tls_port) || !port ? tls_port : port));
}

static int parse_shards(const redisReply *rep, tg_redis_slotmap_t *m) {
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *sh = rep->element[i];
        const redisReply *slots = field(sh, "slots"), *nodes = field(sh, "nodes");
        if (!slots || slots->type != REDIS_REPLY_ARRAY || !nodes || nodes->type != REDIS_REPLY_ARRAY ||
            slots->elements % 2)
            return -1;
        if (slots->elements == 0)
            continue; /* a shard without slots (being added, or emptied) */
        int primary = -1;
        for (size_t k = 0; k < nodes->elements && primary < 0; k++) {
            const redisReply *n = nodes->element[k];
            const redisReply *health = field(n, "health");
            if (!rep_eq(field(n, "role"), "master") || rep_eq(health, "fail") || rep_eq(health, "failed"))
                continue;
            primary = shard_node(m, n);
            if (primary < 0)
                return -1;
        }
        if (primary < 0)
            continue; /* its primary failed and no replica took over yet: unserved */
        for (size_t k = 0; k < slots->elements; k += 2)
            if (map_range(m, rep_int(slots->element[k]), rep_int(slots->element[k + 1]), primary) < 0)
                return -1;
    }
    return 0;
}

static int parse_slots(const redisReply *rep, tg_redis_slotmap_t *m) {
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *r = rep->element[i];
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3)
            return -1;
        const redisReply *n = r->element[2];
        if (!n || n->type != REDIS_REPLY_ARRAY || n->elements < 2 || !rep_is_str(n->element[0]))
            return -1;
        int node = map_node(m, n->element[0]->str, n->element[0]->len, rep_int(n->element[1]));
        if (node < 0 || map_range(m, rep_int(r->element[0]), rep_int(r->element[1]), node) < 0)
            return -1;
    }
    return 0;
}

int tg_redis_slotmap_parse(const redisReply *rep, int shards, tg_redis_slotmap_t *m) {
    m->nnodes = 0;
    m->covered = 0;
    for (int s = 0; s < TG_REDIS_SLOTS; s++)
        m->slot[s] = -1;
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        return -1;
    if ((shards ? parse_shards(rep, m) : parse_slots(rep, m)) < 0 || m->covered == 0)
        return -1;
    return m->covered;
}
