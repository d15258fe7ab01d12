/*
 * The Redis scripts (the Lua files of core/redis/, tg_scripts.c): each assembles from its embedded
 * file and fragments, and the money reservation is one fragment (money.lua) that the
 * admission (admit.lua, money alone) and the separate reservation (reserve.lua) take
 * identically: same checks, same writes, key for key. The Redis half runs against
 * TOLLGATE_REDIS (spec/run.sh sets it) and passes vacuously without it.
 */
#include <unistd.h>

#include "tg_test.h"
#include "tg_test_redis.h"
#include "tollgate/tg_embed.h"
#include "tollgate/tg_scripts.h"

static const char *const NAMES[] = {"admit", "release", "correct", "renew", "reserve", "settle", "debit", "topup", "lock", "unlock"};

TG_TEST(scripts, every_script_assembles_and_money_is_one_fragment) {
    const char *money = NULL;
    for (const tg_embed_file_t *f = tg_embedded_redis; f->name; f++)
        if (!strcmp(f->name, "money"))
            money = f->data;
    ASSERT(money);
    for (size_t i = 0; i < sizeof(NAMES) / sizeof(NAMES[0]); i++) {
        const char *s = tg_scripts_source(NAMES[i]);
        ASSERT(s && *s);
        ASSERT(tg_scripts_source(NAMES[i]) == s); /* made once */
        ASSERT(!strstr(s, "\n--@") && strncmp(s, "--@", 3));
        int takes_money = !strcmp(NAMES[i], "admit") || !strcmp(NAMES[i], "reserve");
        const char *at = strstr(s, money);
        ASSERT(takes_money ? at && !strstr(at + 1, money) : !at);
    }
}

/* Runs script `name` by EVAL with keys and arguments; returns the reply. */
static redisReply *eval(redisContext *c, const char *name, int nkeys, int argc, const char **argv) {
    const char *v[16] = {"EVAL", tg_scripts_source(name)};
    char n[8];
    snprintf(n, sizeof(n), "%d", nkeys);
    v[2] = n;
    for (int i = 0; i < argc; i++)
        v[3 + i] = argv[i];
    redisReply *r = redisCommandArgv(c, 3 + argc, v, NULL);
    ASSERT(r);
    if (r->type == REDIS_REPLY_ERROR)
        fprintf(stderr, "%s: %s\n", name, r->str);
    ASSERT(r->type != REDIS_REPLY_ERROR);
    return r;
}

/* The money keys of tenant t, as text: "money=<avail>/<reserved> res=<amt> hold=<v> key=<avail>". */
static void state(redisContext *c, const char *t, char *out, size_t cap) {
    redisReply *m = redisCommand(c, "HMGET {t:%s}:money avail reserved", t);
    redisReply *res = redisCommand(c, "GET {t:%s}:res:r1:1", t);
    redisReply *h = redisCommand(c, "HGET {t:%s}:holds r1:1", t);
    redisReply *k = redisCommand(c, "HGET {t:%s}:kmoney:9 avail", t);
    redisReply *ttl = redisCommand(c, "TTL {t:%s}:res:r1:1", t);
    snprintf(out, cap, "money=%s/%s res=%s ttl>6d=%d hold=%s key=%s", m->element[0]->str ? m->element[0]->str : "-",
             m->element[1]->str ? m->element[1]->str : "-", res->str ? res->str : "-", ttl->integer > 6 * 86400,
             h->str ? h->str : "-", k->str ? k->str : "-");
    freeReplyObject(m);
    freeReplyObject(res);
    freeReplyObject(h);
    freeReplyObject(k);
    freeReplyObject(ttl);
}

/* One reservation through admit.lua (money alone) for tenant ta and through reserve.lua
 * for tenant tb: the same answer kind and the same state after. */
static void same(redisContext *c, const char *ta, const char *tb, const char *amount, const char *tinit,
                 const char *kinit, int *admit_code, char *reserve_what, size_t cap) {
    char ka[4][64], kb[4][64];
    snprintf(ka[0], 64, "{t:%s}:money", ta);
    snprintf(ka[1], 64, "{t:%s}:res:r1:1", ta);
    snprintf(ka[2], 64, "{t:%s}:holds", ta);
    snprintf(ka[3], 64, "{t:%s}:kmoney:9", ta);
    snprintf(kb[0], 64, "{t:%s}:money", tb);
    snprintf(kb[1], 64, "{t:%s}:res:r1:1", tb);
    snprintf(kb[2], 64, "{t:%s}:kmoney:9", tb);
    snprintf(kb[3], 64, "{t:%s}:holds", tb);
    const char *hold = "9|inst|1700000000000|" "500|m";
    int budget = strcmp(kinit, "-1") != 0;
    const char *a[9] = {ka[0], ka[1], ka[2], ka[3], "r1", amount, tinit, hold, kinit};
    const char *a3[8] = {ka[0], ka[1], ka[2], "r1", amount, tinit, hold};
    redisReply *ra = budget ? eval(c, "admit", 4, 9, a) : eval(c, "admit", 3, 7, a3);
    *admit_code = ra->type == REDIS_REPLY_INTEGER ? (int)ra->integer : (int)ra->element[0]->integer;
    freeReplyObject(ra);
    const char *b[9] = {kb[0], kb[1], kb[2], kb[3], amount, tinit, kinit, "r1:1", hold};
    redisReply *rb = eval(c, "reserve", 4, 9, b);
    snprintf(reserve_what, cap, "%s", rb->element[1]->str);
    freeReplyObject(rb);
    char sa[256], sb[256];
    state(c, ta, sa, sizeof(sa));
    state(c, tb, sb, sizeof(sb));
    if (strcmp(sa, sb)) {
        fprintf(stderr, "admit: %s\nreserve: %s\n", sa, sb);
        exit(1);
    }
}

TG_TEST(scripts, admission_and_reservation_reserve_alike) {
    const char *url = getenv("TOLLGATE_REDIS");
    if (!url)
        return;
    redisContext *c = side_connect(url);
    char ta[32], tb[32], what[32];
    int code;
    /* The balance is not live and not sent: init, nothing written. */
    snprintf(ta, sizeof(ta), "u%da", (int)getpid());
    snprintf(tb, sizeof(tb), "u%db", (int)getpid());
    same(c, ta, tb, "500", "", "-1", &code, what, sizeof(what));
    ASSERT_EQ_INT(code, 9);
    ASSERT_EQ_STR(what, "init");
    /* Loaded and reserved, with a key budget. */
    same(c, ta, tb, "500", "2000", "800", &code, what, sizeof(what));
    ASSERT_EQ_INT(code, 0);
    ASSERT_EQ_STR(what, "ok");
    /* The same request again: already reserved. */
    same(c, ta, tb, "500", "2000", "800", &code, what, sizeof(what));
    ASSERT_EQ_INT(code, 1);
    ASSERT_EQ_STR(what, "duplicate");
    /* Refusals: the key budget first, then the balance; nothing but the loaded balance written. */
    snprintf(ta, sizeof(ta), "v%da", (int)getpid());
    snprintf(tb, sizeof(tb), "v%db", (int)getpid());
    same(c, ta, tb, "500", "2000", "499", &code, what, sizeof(what));
    ASSERT_EQ_INT(code, 8);
    ASSERT_EQ_STR(what, "key budget");
    snprintf(ta, sizeof(ta), "w%da", (int)getpid());
    snprintf(tb, sizeof(tb), "w%db", (int)getpid());
    same(c, ta, tb, "500", "499", "-1", &code, what, sizeof(what));
    ASSERT_EQ_INT(code, 7);
    ASSERT_EQ_STR(what, "balance");
    /* Zero costs nothing but is still a hold. */
    snprintf(ta, sizeof(ta), "z%da", (int)getpid());
    snprintf(tb, sizeof(tb), "z%db", (int)getpid());
    same(c, ta, tb, "0", "10", "-1", &code, what, sizeof(what));
    ASSERT_EQ_INT(code, 0);
    ASSERT_EQ_STR(what, "ok");
    redisFree(c);
}
