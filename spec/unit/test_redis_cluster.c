/*
 * Redis Cluster's connection-free pieces (core/src/io/tg_redis_cluster.c): the key slot
 * (CRC16 with hash tags, checked against what a real node's CLUSTER KEYSLOT answers),
 * the first key of a command, MOVED / ASK errors, and the slot map read from CLUSTER
 * SHARDS and CLUSTER SLOTS replies (as RESP bytes, parsed by hiredis as the client does).
 */
#include <hiredis/hiredis.h>

#include "tg_test.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_redis_cluster.h"

static int slot_of(const char *k) { return tg_redis_key_slot(k, strlen(k)); }

TG_TEST(redis_cluster, key_slots_match_a_real_node) {
    ASSERT_EQ_INT(tg_redis_crc16("123456789", 9), 0x31C3); /* CRC16/XMODEM's check value */
    /* CLUSTER KEYSLOT of redis-server 7.0 */
    ASSERT_EQ_INT(slot_of("foo"), 12182);
    ASSERT_EQ_INT(slot_of("bar"), 5061);
    ASSERT_EQ_INT(slot_of("hello"), 866);
    ASSERT_EQ_INT(slot_of("{user1000}.following"), 3443);
    ASSERT_EQ_INT(slot_of("foo{}{bar}"), 8363);    /* an empty tag: the whole key */
    ASSERT_EQ_INT(slot_of("foo{{bar}}zap"), 4015); /* the tag is "{bar" */
    ASSERT_EQ_INT(slot_of("foo{bar}{zap}"), 5061); /* the first tag: "bar" */
    ASSERT_EQ_INT(slot_of("{}"), 15257);
    ASSERT_EQ_INT(slot_of("a{b"), 13340); /* no closing brace: the whole key */
    ASSERT_EQ_INT(slot_of("tollgate:alive"), 9696);
    ASSERT_EQ_INT(slot_of("{a:7}:conc"), 177);
    /* every key of one tenant lands on one slot */
    ASSERT_EQ_INT(slot_of("{t:42}:money"), 5536);
    ASSERT_EQ_INT(slot_of("{t:42}:holds"), 5536);
    ASSERT_EQ_INT(slot_of("{t:42}:conc:k:7"), 5536);
    ASSERT_EQ_INT(slot_of("{t:42}:bud:3:1700000000"), 5536);
}

TG_TEST(redis_cluster, a_commands_first_key) {
    const char *key;
    size_t len;
    const char *get[] = {"GET", "{a:1}:quota"};
    ASSERT_EQ_INT(tg_redis_command_key(2, get, NULL, &key, &len), 0);
    ASSERT(len == 11 && memcmp(key, "{a:1}:quota", 11) == 0);
    const char *evalsha[] = {"evalsha", "0123", "2", "{t:9}:money", "{t:9}:holds", "arg"};
    ASSERT_EQ_INT(tg_redis_command_key(6, evalsha, NULL, &key, &len), 0);
    ASSERT(strcmp(key, "{t:9}:money") == 0);
    const char *nokeys[] = {"EVAL", "return 1", "0", "x"};
    ASSERT_EQ_INT(tg_redis_command_key(4, nokeys, NULL, &key, &len), -1);
    const char *bad[] = {"EVAL", "return 1", "x1"};
    ASSERT_EQ_INT(tg_redis_command_key(3, bad, NULL, &key, &len), -1);
    const char *one[] = {"PING"};
    ASSERT_EQ_INT(tg_redis_command_key(1, one, NULL, &key, &len), -1);
}

static int redirect(const char *s, int *slot, char *host, int *port) {
    return tg_redis_parse_redirect(s, strlen(s), slot, host, port);
}

TG_TEST(redis_cluster, moved_and_ask_are_read) {
    char host[TG_REDIS_HOST_MAX];
    int slot, port;
    ASSERT_EQ_INT(redirect("MOVED 3999 127.0.0.1:6381", &slot, host, &port), TG_REDIS_REDIRECT_MOVED);
    ASSERT(slot == 3999 && port == 6381 && strcmp(host, "127.0.0.1") == 0);
    ASSERT_EQ_INT(redirect("ASK 16383 10.0.0.2:7000", &slot, host, &port), TG_REDIS_REDIRECT_ASK);
    ASSERT(slot == 16383 && port == 7000 && strcmp(host, "10.0.0.2") == 0);
    ASSERT_EQ_INT(redirect("MOVED 0 ::1:7001", &slot, host, &port), TG_REDIS_REDIRECT_MOVED); /* IPv6: last colon */
    ASSERT(slot == 0 && port == 7001 && strcmp(host, "::1") == 0);
    ASSERT_EQ_INT(redirect("MOVED 12 [::1]:7001", &slot, host, &port), TG_REDIS_REDIRECT_MOVED);
    ASSERT(strcmp(host, "::1") == 0);
    ASSERT_EQ_INT(redirect("MOVED 12 :7002", &slot, host, &port), TG_REDIS_REDIRECT_MOVED); /* the same host */
    ASSERT(host[0] == '\0' && port == 7002);
    ASSERT_EQ_INT(redirect("MOVED 3999 redis-2.internal:6379", &slot, host, &port), TG_REDIS_REDIRECT_MOVED);
    ASSERT(strcmp(host, "redis-2.internal") == 0);
    const char *bad[] = {"MOVED", "MOVED ", "MOVED 16384 h:1", "MOVED 99999 h:1", "MOVED -1 h:1", "MOVED 1 h",
                         "MOVED 1 h:", "MOVED 1 h:0", "MOVED 1 h:65536", "MOVED 1 h:12a", "MOVED 1 h:1 x",
                         "MOVED x h:1", "moved 1 h:1", "ASK", "TRYAGAIN Multiple keys request during rehashing of slot",
                         "CLUSTERDOWN The cluster is down", "ERR unknown command", "MOVED 1 h:123456", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (redirect(bad[i], &slot, host, &port) != TG_REDIS_REDIRECT_NONE) {
            fprintf(stderr, "taken for a redirection: \"%s\"\n", bad[i]);
            exit(1);
        }
}

/* A reply from RESP bytes, as hiredis parses it off the socket. */
static redisReply *resp(const char *bytes) {
    redisReader *rd = redisReaderCreate();
    redisReaderFeed(rd, bytes, strlen(bytes));
    void *out = NULL;
    ASSERT(redisReaderGetReply(rd, &out) == REDIS_OK && out);
    redisReaderFree(rd);
    return out;
}

#define NODE(id, port, ip, role, health)                                                                     \
    "*12\r\n$2\r\nid\r\n$" id "\r\n$4\r\nport\r\n:" port "\r\n$2\r\nip\r\n$9\r\n" ip "\r\n$8\r\nendpoint\r\n$9\r\n" ip \
    "\r\n$4\r\nrole\r\n" role "\r\n$6\r\nhealth\r\n" health "\r\n"
#define MASTER "$6\r\nmaster"
#define REPLICA "$7\r\nreplica"
#define ONLINE "$6\r\nonline"
#define FAILED "$4\r\nfail"

TG_TEST(redis_cluster, the_map_from_cluster_shards) {
    /* Three shards; the second one's primary failed and its replica took over; the
     * third one's primary failed with no replica promoted yet (unserved). */
    const char *shards =
        "*3\r\n"
        "*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*2\r\n"
            NODE("1\r\na", "7000", "127.0.0.1", MASTER, ONLINE) NODE("1\r\nb", "7003", "127.0.0.1", REPLICA, ONLINE)
        "*4\r\n$5\r\nslots\r\n*4\r\n:5461\r\n:10000\r\n:10001\r\n:10922\r\n$5\r\nnodes\r\n*2\r\n"
            NODE("1\r\nc", "7001", "127.0.0.1", MASTER, FAILED) NODE("1\r\nd", "7004", "127.0.0.1", MASTER, ONLINE)
        "*4\r\n$5\r\nslots\r\n*2\r\n:10923\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n"
            NODE("1\r\ne", "7002", "127.0.0.1", MASTER, FAILED);
    redisReply *r = resp(shards);
    tg_redis_slotmap_t *m = malloc(sizeof(*m));
    ASSERT_EQ_INT(tg_redis_slotmap_parse(r, 1, m), 10923);
    ASSERT_EQ_INT(m->nnodes, 2);
    ASSERT(strcmp(m->nodes[m->slot[0]].host, "127.0.0.1") == 0);
    ASSERT_EQ_INT(m->nodes[m->slot[0]].port, 7000);
    ASSERT_EQ_INT(m->nodes[m->slot[5460]].port, 7000);
    ASSERT_EQ_INT(m->nodes[m->slot[5461]].port, 7004); /* the promoted replica, not the failed primary */
    ASSERT_EQ_INT(m->nodes[m->slot[10922]].port, 7004);
    ASSERT_EQ_INT(m->slot[10923], -1);
    ASSERT_EQ_INT(m->slot[16383], -1);
    freeReplyObject(r);
    /* not a map: an error, a flat array, slots of an odd count */
    const char *bad[] = {"-ERR unknown subcommand\r\n", "*1\r\n:1\r\n", "*0\r\n",
                         "*1\r\n*4\r\n$5\r\nslots\r\n*1\r\n:0\r\n$5\r\nnodes\r\n*0\r\n",
                         "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:5\r\n:16384\r\n$5\r\nnodes\r\n*1\r\n" NODE(
                             "1\r\na", "7000", "127.0.0.1", MASTER, ONLINE)};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = resp(bad[i]);
        ASSERT_EQ_INT(tg_redis_slotmap_parse(r, 1, m), -1);
        freeReplyObject(r);
    }
    free(m);
}

/* A node's entry with a "port" and a "tls-port" (both given: "port" then "tls-port";
 * one only: port NULL or tls NULL). */
#define NODE_TLS(fields, extra)                                                                            \
    "*" fields "\r\n$2\r\nid\r\n$1\r\na\r\n" extra "$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n" MASTER \
    "\r\n$6\r\nhealth\r\n" ONLINE "\r\n"
#define ONE_SHARD(node) "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n" node

TG_TEST(redis_cluster, a_tls_client_takes_the_tls_port) {
    const char *both = ONE_SHARD(NODE_TLS("12", "$4\r\nport\r\n:7000\r\n$8\r\ntls-port\r\n:8000\r\n"));
    const char *tls_only = ONE_SHARD(NODE_TLS("10", "$8\r\ntls-port\r\n:8001\r\n"));
    tg_redis_slotmap_t *m = calloc(1, sizeof(*m));
    struct {
        const char *reply;
        int tls, port;
    } cases[] = {{both, 0, 7000}, {both, 1, 8000}, {tls_only, 1, 8001}, {tls_only, 0, 8001}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        redisReply *r = resp(cases[i].reply);
        m->tls = cases[i].tls;
        ASSERT_EQ_INT(tg_redis_slotmap_parse(r, 1, m), 16384);
        ASSERT_EQ_INT(m->nodes[m->slot[100]].port, cases[i].port);
        freeReplyObject(r);
    }
    free(m);
}

TG_TEST(redis_cluster, the_map_from_cluster_slots) {
    const char *slots = "*2\r\n"
                        "*4\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$1\r\na\r\n"
                        "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$1\r\nb\r\n"
                        "*3\r\n:8192\r\n:16383\r\n*3\r\n$0\r\n\r\n:7001\r\n$1\r\nc\r\n";
    redisReply *r = resp(slots);
    tg_redis_slotmap_t *m = malloc(sizeof(*m));
    ASSERT_EQ_INT(tg_redis_slotmap_parse(r, 0, m), 16384);
    ASSERT_EQ_INT(m->nodes[m->slot[8191]].port, 7000); /* the primary, never the replica */
    ASSERT_EQ_INT(m->nodes[m->slot[8192]].port, 7001);
    ASSERT(m->nodes[m->slot[8192]].host[0] == '\0'); /* "": the node that answered */
    freeReplyObject(r);
    free(m);
}

TG_TEST(redis_cluster, seed_urls) {
    tg_redis_url_t u;
    ASSERT_EQ_INT(tg_redis_url_parse("redis-cluster://ops:s3cret@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002", &u), TG_OK);
    ASSERT(u.cluster == 1 && strcmp(u.host, "10.0.0.1") == 0 && u.port == 7000);
    ASSERT(strcmp(u.user, "ops") == 0 && strcmp(u.pass, "s3cret") == 0);
    ASSERT(strcmp(u.seeds, "10.0.0.1:7000,10.0.0.2:7001,[::1]:7002") == 0);
    tg_redis_url_free(&u);
    ASSERT_EQ_INT(tg_redis_url_parse("redis-cluster://h", &u), TG_OK);
    ASSERT(u.port == 6379 && u.tls == 0);
    tg_redis_url_free(&u);
    /* TLS: the same seeds, and tg_redis_url_is_cluster says so. */
    ASSERT_EQ_INT(tg_redis_url_parse("rediss-cluster://:pw@10.0.0.1:7000,node-b:7001", &u), TG_OK);
    ASSERT(u.cluster == 1 && u.tls == 1 && strcmp(u.host, "10.0.0.1") == 0 && u.port == 7000);
    ASSERT(strcmp(u.pass, "pw") == 0 && strcmp(u.seeds, "10.0.0.1:7000,node-b:7001") == 0);
    tg_redis_url_free(&u);
    ASSERT(tg_redis_url_is_cluster("rediss-cluster://h:1") && !tg_redis_url_is_cluster("rediss://h:1"));
    const char *bad[] = {"redis-cluster://", "redis-cluster://h:1,", "redis-cluster://h:1,,h:2",
                         "redis-cluster://h:1/2", "redis-cluster://h:0",
                         "redis-cluster://h:x",
                         "rediss-cluster://",
                         "rediss-cluster://h:1,",
                         "rediss-cluster://h:1/0",
                         "rediss-clusterx://h:1",
                         "redis-clusters://h:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (tg_redis_url_parse(bad[i], &u) != TG_ERROR) {
            fprintf(stderr, "accepted: %s\n", bad[i]);
            exit(1);
        }
}
