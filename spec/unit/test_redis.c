/*
 * The Redis client (tg_redis.c) against a real server: TOLLGATE_REDIS is
 * "unix:///path/to.sock" or "redis://host:port" (spec/run.sh starts a private server and
 * sets it). Each test runs its own uv_loop, uses keys prefixed with its pid, and ends
 * with the client destroyed and the loop closed cleanly. Without TOLLGATE_REDIS,
 * `tg_unit redis` exits 77 (skipped) and the tests pass vacuously when run with the rest.
 */
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <unistd.h>
#include <uv.h>

#include "tg_test.h"
#include "tg_test_redis.h"
#include "tollgate/tg_redis.h"

/* `tg_unit redis` without a server: skip the module (glibc passes argc/argv to
 * constructors). */
__attribute__((constructor)) static void redis_skip_without_server(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "redis") == 0 && !getenv("TOLLGATE_REDIS")) {
        fprintf(stderr, "skipped: TOLLGATE_REDIS (unix:///path or redis://host:port) is not set\n");
        exit(77);
    }
}

#define NEED_REDIS()                                                                        \
    const char *url = getenv("TOLLGATE_REDIS");                                             \
    if (!url) {                                                                             \
        fprintf(stderr, "skipped: TOLLGATE_REDIS is not set\n");                            \
        return;                                                                             \
    }

typedef struct {
    int calls;
    const char *err;
    char errtext[256];
    int type;
    long long integer;
    char str[256];
} result_t;

static void on_result(void *ud, redisReply *reply, const char *err) {
    result_t *r = ud;
    r->calls++;
    r->err = err;
    snprintf(r->errtext, sizeof(r->errtext), "%s", err ? err : "");
    r->type = reply ? reply->type : -1;
    if (reply && (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS ||
                  reply->type == REDIS_REPLY_ERROR))
        snprintf(r->str, sizeof(r->str), "%.*s", (int)reply->len, reply->str);
    if (reply && reply->type == REDIS_REPLY_INTEGER)
        r->integer = reply->integer;
}

static void on_never(void *ud, redisReply *reply, const char *err) {
    (void)reply;
    (void)err;
    ++*(int *)ud;
}

static void wake(uv_timer_t *t) { (void)t; }

static int run_until(uv_loop_t *loop, const int *count, int want, int ms) {
    uv_timer_t tick;
    uv_timer_init(loop, &tick);
    uv_timer_start(&tick, wake, 5, 5);
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + (uint64_t)ms;
    while (*count < want && uv_now(loop) < end)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return *count >= want;
}

static void run_for(uv_loop_t *loop, int ms) {
    int never = 0;
    run_until(loop, &never, 1, ms);
}

static void wait_connected(uv_loop_t *loop, tg_redis_t *r) {
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + 5000;
    while (!tg_redis_connected(r) && uv_now(loop) < end)
        run_for(loop, 5);
    ASSERT(tg_redis_connected(r));
}

static void finish(uv_loop_t *loop, tg_redis_t *r) {
    tg_redis_destroy(r);
    uv_run(loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(loop), 0);
}

/* Sends a command and waits for its answer. */
static result_t cmd(uv_loop_t *loop, tg_redis_t *r, int argc, const char **argv) {
    result_t res = {0};
    ASSERT(tg_redis_command(r, on_result, &res, argc, argv, NULL));
    ASSERT_EQ_INT(res.calls, 0); /* never from inside the call */
    ASSERT(run_until(loop, &res.calls, 1, 5000));
    return res;
}

#define CMD(loop, r, ...) cmd((loop), (r), sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *), \
                              (const char *[]){__VA_ARGS__})

/* The id of this process's connection of the given kind ("cmd" or "sub"). */
static long long client_id(redisContext *side, const char *kind) {
    char name[64];
    snprintf(name, sizeof(name), "name=tollgate:%d:%s ", (int)getpid(), kind);
    redisReply *rep = redisCommand(side, "CLIENT LIST");
    ASSERT(rep && rep->type == REDIS_REPLY_STRING);
    long long id = -1;
    for (char *line = rep->str; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (strstr(line, name))
            id = atoll(line + 3); /* "id=N ..." */
        line = nl ? nl + 1 : NULL;
    }
    freeReplyObject(rep);
    return id;
}

TG_TEST(redis, set_get) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    ASSERT(r);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:k", (int)getpid());
    /* Issued before the first connect finished: it waits for it. */
    result_t s = CMD(&loop, r, "SET", key, "v\0x"); /* C string: "v" */
    ASSERT(s.err == NULL);
    ASSERT_EQ_STR(s.str, "OK");
    const char *argv[] = {"SET", key, "bin\0ary"};
    size_t argvlen[] = {3, strlen(key), 7};
    result_t b = {0};
    ASSERT(tg_redis_command(r, on_result, &b, 3, argv, argvlen));
    ASSERT(run_until(&loop, &b.calls, 1, 5000));
    ASSERT(b.err == NULL);
    result_t g = CMD(&loop, r, "STRLEN", key);
    ASSERT(g.err == NULL);
    ASSERT_EQ_INT(g.integer, 7);
    result_t miss = CMD(&loop, r, "GET", "tg:unit:no-such-key");
    ASSERT(miss.err == NULL);
    ASSERT_EQ_INT(miss.type, REDIS_REPLY_NIL);
    CMD(&loop, r, "DEL", key);
    ASSERT(tg_redis_connected(r));
    ASSERT_EQ_INT(tg_redis_stats(r)->commands, 5);
    ASSERT_EQ_INT(tg_redis_stats(r)->connects, 1);
    finish(&loop, r);
}

TG_TEST(redis, error_reply_is_passed_with_its_text) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:s", (int)getpid());
    CMD(&loop, r, "SET", key, "text");
    result_t e = CMD(&loop, r, "INCR", key);
    ASSERT_EQ_INT(e.type, REDIS_REPLY_ERROR);
    ASSERT(e.err != NULL);
    ASSERT_EQ_STR(e.errtext, "ERR value is not an integer or out of range");
    CMD(&loop, r, "DEL", key);
    finish(&loop, r);
}

TG_TEST(redis, eval_and_noscript_reload) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    const char *lua = "return redis.call('INCRBY', KEYS[1], ARGV[1])";
    int id = tg_redis_script_register(r, lua);
    ASSERT(id >= 0);
    ASSERT_EQ_INT(tg_redis_script_register(r, lua), id);
    ASSERT(tg_redis_script_register(r, "return 1") != id);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:{e}", (int)getpid());
    CMD(&loop, r, "DEL", key);

    const char *argv[] = {key, "5"};
    result_t a = {0}, b = {0}, c = {0};
    ASSERT(tg_redis_eval(r, id, 1, 2, argv, NULL, on_result, &a));
    ASSERT(run_until(&loop, &a.calls, 1, 5000));
    ASSERT(a.err == NULL);
    ASSERT_EQ_INT(a.integer, 5);
    ASSERT(tg_redis_eval(r, id, 1, 2, argv, NULL, on_result, &b));
    ASSERT(run_until(&loop, &b.calls, 1, 5000));
    ASSERT_EQ_INT(b.integer, 10);
    uint64_t loads = tg_redis_stats(r)->script_loads; /* 1, unless another test loaded it */

    result_t f = CMD(&loop, r, "SCRIPT", "FLUSH");
    ASSERT(f.err == NULL);
    ASSERT(tg_redis_eval(r, id, 1, 2, argv, NULL, on_result, &c));
    ASSERT(run_until(&loop, &c.calls, 1, 5000));
    ASSERT(c.err == NULL);
    ASSERT_EQ_INT(c.integer, 15);
    ASSERT_EQ_INT(tg_redis_stats(r)->script_loads, loads + 1);

    /* A script error is a Redis error reply, not a retry loop. */
    int bad = tg_redis_script_register(r, "return redis.call('NOSUCHCOMMAND')");
    result_t e = {0};
    ASSERT(tg_redis_eval(r, bad, 0, 0, NULL, NULL, on_result, &e));
    ASSERT(run_until(&loop, &e.calls, 1, 5000));
    ASSERT(e.err != NULL);
    ASSERT_EQ_INT(e.type, REDIS_REPLY_ERROR);
    ASSERT(tg_redis_eval(r, 99, 0, 0, NULL, NULL, on_result, &e) == NULL);
    CMD(&loop, r, "DEL", key);
    finish(&loop, r);
}

TG_TEST(redis, timeout_then_late_reply_dropped) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 200);
    wait_connected(&loop, r);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:empty-list", (int)getpid());
    /* The server answers after 1 s: a slow command, from the client's view. */
    result_t t = {0};
    uint64_t t0 = uv_hrtime();
    ASSERT(tg_redis_command(r, on_result, &t, 3, (const char *[]){"BLPOP", key, "1"}, NULL));
    ASSERT(run_until(&loop, &t.calls, 1, 3000));
    uint64_t ms = (uv_hrtime() - t0) / 1000000;
    ASSERT(t.err == tg_redis_err_timeout);
    ASSERT_EQ_INT(t.type, -1);
    ASSERT(ms >= 150 && ms < 700);
    ASSERT_EQ_INT(tg_redis_stats(r)->timeouts, 1);
    /* The late reply comes and is dropped; the connection keeps working. */
    run_for(&loop, 1000);
    ASSERT_EQ_INT(t.calls, 1);
    result_t p = CMD(&loop, r, "PING");
    ASSERT(p.err == NULL);
    ASSERT_EQ_STR(p.str, "PONG");
    ASSERT_EQ_INT(tg_redis_stats(r)->disconnects, 0);
    finish(&loop, r);
}

TG_TEST(redis, disconnect_fails_pending_then_reconnects) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 5000);
    wait_connected(&loop, r);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:blocked", (int)getpid());
    result_t pending = {0};
    ASSERT(tg_redis_command(r, on_result, &pending, 3, (const char *[]){"BLPOP", key, "10"}, NULL));
    run_for(&loop, 50);

    redisContext *side = side_connect(url);
    long long id = client_id(side, "cmd");
    ASSERT(id > 0);
    redisReply *rep = redisCommand(side, "CLIENT KILL ID %lld", id);
    ASSERT(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1);
    freeReplyObject(rep);

    ASSERT(run_until(&loop, &pending.calls, 1, 2000));
    ASSERT(pending.err == tg_redis_err_disconnected);
    ASSERT(!tg_redis_connected(r));
    ASSERT_EQ_INT(tg_redis_stats(r)->disconnects, 1);

    /* While down, commands fail at once, but not from inside the call. */
    result_t fast = {0};
    ASSERT(tg_redis_command(r, on_result, &fast, 1, (const char *[]){"PING"}, NULL));
    ASSERT_EQ_INT(fast.calls, 0);
    ASSERT(run_until(&loop, &fast.calls, 1, 100));
    ASSERT(fast.err == tg_redis_err_disconnected);
    ASSERT(tg_redis_stats(r)->failed_fast >= 1);

    wait_connected(&loop, r);
    result_t p = CMD(&loop, r, "PING");
    ASSERT(p.err == NULL);
    ASSERT_EQ_INT(tg_redis_stats(r)->connects, 2);
    redisFree(side);
    finish(&loop, r);
}

TG_TEST(redis, no_server_fails_fast) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    ASSERT(tg_redis_create(&loop, "http://x", 200) == NULL);
    ASSERT(tg_redis_create(&loop, "redis://host:99999", 200) == NULL);
    tg_redis_t *r = tg_redis_create(&loop, "unix:///nonexistent-tollgate-dir/redis.sock", 200);
    ASSERT(r);
    result_t a = {0};
    ASSERT(tg_redis_command(r, on_result, &a, 1, (const char *[]){"PING"}, NULL));
    ASSERT_EQ_INT(a.calls, 0);
    ASSERT(run_until(&loop, &a.calls, 1, 100));
    ASSERT(a.err == tg_redis_err_disconnected);
    run_for(&loop, 300); /* a few reconnect attempts */
    ASSERT(!tg_redis_connected(r));
    finish(&loop, r);
}

typedef struct {
    int msgs;
    int gaps;
    char last[64];
} sub_t;

static void on_msg(void *ud, const char *msg, size_t len) {
    sub_t *s = ud;
    if (!msg) {
        s->gaps++;
        return;
    }
    s->msgs++;
    snprintf(s->last, sizeof(s->last), "%.*s", (int)len, msg);
}

/* Publishes every 20 ms until the subscriber has `want` messages. */
static void publish_until(uv_loop_t *loop, tg_redis_t *r, const char *ch, const char *msg, sub_t *s, int want) {
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + 5000;
    while (s->msgs < want && uv_now(loop) < end) {
        tg_redis_publish(r, ch, msg, strlen(msg), NULL, NULL);
        run_for(loop, 20);
    }
    ASSERT(s->msgs >= want);
}

TG_TEST(redis, pubsub_round_trip_and_resubscribe) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    char ch[64];
    snprintf(ch, sizeof(ch), "tg:unit:%d:ch", (int)getpid());
    sub_t a = {0}, b = {0};
    ASSERT_EQ_INT(tg_redis_subscribe(r, ch, on_msg, &a), TG_OK);
    ASSERT_EQ_INT(tg_redis_subscribe(r, ch, on_msg, &b), TG_OK);
    publish_until(&loop, r, ch, "hello", &a, 1);
    ASSERT_EQ_STR(a.last, "hello");
    ASSERT(run_until(&loop, &b.msgs, a.msgs, 1000));
    ASSERT_EQ_INT(a.gaps, 0);

    /* The publish reply counts receivers: one subscriber connection. */
    result_t p = {0};
    ASSERT(tg_redis_publish(r, ch, "x\0y", 3, on_result, &p));
    ASSERT(run_until(&loop, &p.calls, 1, 2000));
    ASSERT_EQ_INT(p.integer, 1);

    /* Kill the subscriber connection: it comes back, re-subscribes, and says a message
     * may have been missed. */
    redisContext *side = side_connect(url);
    long long id = client_id(side, "sub");
    ASSERT(id > 0);
    redisReply *rep = redisCommand(side, "CLIENT KILL ID %lld", id);
    ASSERT(rep && rep->integer == 1);
    freeReplyObject(rep);
    ASSERT(run_until(&loop, &a.gaps, 1, 5000));
    ASSERT(run_until(&loop, &b.gaps, 1, 1000));
    int before = a.msgs;
    publish_until(&loop, r, ch, "again", &a, before + 1);
    ASSERT_EQ_STR(a.last, "again");
    ASSERT_EQ_INT(a.gaps, 1);
    redisFree(side);
    finish(&loop, r);
}

TG_TEST(redis, cancel_means_no_callback) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    wait_connected(&loop, r);
    int never = 0;
    tg_redis_req_t *q = tg_redis_command(r, on_never, &never, 1, (const char *[]){"PING"}, NULL);
    ASSERT(q);
    tg_redis_cancel(q);
    tg_redis_cancel(NULL);
    result_t after = CMD(&loop, r, "PING"); /* replies are in order: the first one is in */
    ASSERT(after.err == NULL);

    /* A command cancelled before its deferred failure. */
    tg_redis_t *down = tg_redis_create(&loop, "unix:///nonexistent-tollgate-dir/redis.sock", 200);
    tg_redis_req_t *d = tg_redis_command(down, on_never, &never, 1, (const char *[]){"PING"}, NULL);
    ASSERT(d);
    tg_redis_cancel(d);
    run_for(&loop, 50);
    ASSERT_EQ_INT(never, 0);
    tg_redis_destroy(down);
    finish(&loop, r);
}

typedef struct {
    int shutdown, other;
} shut_t;

static void on_shut(void *ud, redisReply *reply, const char *err) {
    shut_t *s = ud;
    (void)reply;
    if (err == tg_redis_err_shutdown)
        s->shutdown++;
    else
        s->other++;
}

TG_TEST(redis, destroy_reports_shutdown) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 5000);
    wait_connected(&loop, r);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:blocked", (int)getpid());
    shut_t s = {0};
    ASSERT(tg_redis_command(r, on_shut, &s, 3, (const char *[]){"BLPOP", key, "5"}, NULL));
    ASSERT(tg_redis_command(r, on_shut, &s, 1, (const char *[]){"PING"}, NULL));
    run_for(&loop, 20);
    tg_redis_destroy(r);
    ASSERT_EQ_INT(s.shutdown, 2);
    ASSERT_EQ_INT(s.other, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}

typedef struct {
    tg_redis_t *r;
    int calls, shutdowns;
} inner_t;

static void on_destroy_inside(void *ud, redisReply *reply, const char *err) {
    inner_t *in = ud;
    (void)reply;
    if (err == tg_redis_err_shutdown) {
        in->shutdowns++;
        return;
    }
    in->calls++;
    tg_redis_destroy(in->r); /* from inside a hiredis reply callback */
    ASSERT(tg_redis_command(in->r, on_destroy_inside, in, 1, (const char *[]){"PING"}, NULL) == NULL);
}

static void on_msg_ignore(void *ud, const char *msg, size_t len) {
    (void)ud;
    (void)msg;
    (void)len;
}

TG_TEST(redis, destroy_from_inside_a_callback) {
    NEED_REDIS();
    uv_loop_t loop;
    uv_loop_init(&loop);
    inner_t in = {0};
    in.r = tg_redis_create(&loop, url, 2000);
    ASSERT_EQ_INT(tg_redis_subscribe(in.r, "tg:unit:ignored", on_msg_ignore, NULL), TG_OK);
    wait_connected(&loop, in.r);
    for (int i = 0; i < 5; i++)
        ASSERT(tg_redis_command(in.r, on_destroy_inside, &in, 1, (const char *[]){"PING"}, NULL));
    ASSERT(run_until(&loop, &in.calls, 1, 5000));
    ASSERT_EQ_INT(in.calls, 1);
    ASSERT_EQ_INT(in.shutdowns, 4);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}
