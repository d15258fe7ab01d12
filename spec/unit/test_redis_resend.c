/*
 * The Redis client's one resend of idempotent scripts (tg_redis_eval_idempotent,
 * core/src/tg_redis.c), which the limiter's releases and billing's hold returns use: a
 * script whose answer is lost (a timeout, a dropped connection) is sent again, up to
 * TG_REDIS_RESEND_TRIES times, 0.5 s to 8 s apart, each resend counted; the caller hears
 * the last answer once; the client keeps at most TG_REDIS_RESEND_PENDING_MAX of them and
 * answers those still waiting when it is destroyed. The scripts here append to a list so
 * that the test can count how often one really ran. Tests that need a server use
 * TOLLGATE_REDIS (spec/run.sh sets it) and pass vacuously without it.
 */
#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include "tg_test.h"
#include "tg_test_redis.h"
#include "tollgate/tg_redis.h"

#define NO_SERVER "unix:///nonexistent-tollgate-dir/redis.sock"
#define RUNS_LUA "return redis.call('RPUSH', KEYS[1], ARGV[1])"

typedef struct {
    int calls;
    const char *err;
    long long integer;
} answer_t;

static void on_answer(void *ud, redisReply *reply, const char *err) {
    answer_t *a = ud;
    a->calls++;
    a->err = err;
    if (reply && reply->type == REDIS_REPLY_INTEGER)
        a->integer = reply->integer;
}

static void wake(uv_timer_t *t) { (void)t; }

/* Runs the loop until *count reaches want or ms pass; 1 when it did. */
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

static void wait_connected(uv_loop_t *loop, tg_redis_t *r) {
    int never = 0;
    for (int i = 0; i < 500 && !tg_redis_connected(r); i++)
        run_until(loop, &never, 1, 10);
    ASSERT(tg_redis_connected(r));
}

static void finish(uv_loop_t *loop, tg_redis_t *r) {
    tg_redis_destroy(r);
    uv_run(loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(loop), 0);
}

/* How many times the script ran: the length of its list (read on the side). */
static long long runs(redisContext *side, const char *key) {
    redisReply *rep = redisCommand(side, "LLEN %s", key);
    ASSERT(rep && rep->type == REDIS_REPLY_INTEGER);
    long long n = rep->integer;
    freeReplyObject(rep);
    return n;
}

/* The id of this process's command connection (named tollgate:<pid>:cmd). */
static long long client_id(redisContext *side) {
    char name[64];
    snprintf(name, sizeof(name), "name=tollgate:%d:cmd ", (int)getpid());
    redisReply *rep = redisCommand(side, "CLIENT LIST");
    ASSERT(rep && rep->type == REDIS_REPLY_STRING);
    const char *line = strstr(rep->str, name);
    ASSERT(line);
    while (line > rep->str && line[-1] != '\n')
        line--;
    long long id = atoll(line + 3); /* "id=N ..." */
    freeReplyObject(rep);
    return id;
}

static void side_do(redisContext *side, const char *cmd) {
    redisReply *rep = redisCommand(side, cmd);
    ASSERT(rep && rep->type != REDIS_REPLY_ERROR);
    freeReplyObject(rep);
}

TG_TEST(redis_resend, an_answered_script_is_sent_once) {
    const char *url = getenv("TOLLGATE_REDIS");
    if (!url)
        return;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    int id = tg_redis_script_register(r, RUNS_LUA);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:once", (int)getpid());
    redisContext *side = side_connect(url);
    const char *argv[2] = {key, "x"};
    answer_t a = {0};
    ASSERT(tg_redis_eval_idempotent(r, id, 1, 2, argv, NULL, on_answer, &a) == TG_OK);
    ASSERT_EQ_INT(a.calls, 0); /* never from inside the call */
    ASSERT(run_until(&loop, &a.calls, 1, 5000));
    ASSERT(a.err == NULL);
    ASSERT_EQ_INT(a.integer, 1);
    ASSERT_EQ_INT(runs(side, key), 1);
    ASSERT_EQ_INT(tg_redis_stats(r)->resends, 0);
    /* Bad arguments: refused at once, no callback. */
    ASSERT(tg_redis_eval_idempotent(r, 99, 0, 0, NULL, NULL, on_answer, &a) == TG_ERROR);
    ASSERT(tg_redis_eval_idempotent(r, id, 3, 2, argv, NULL, on_answer, &a) == TG_ERROR);
    ASSERT(tg_redis_eval_idempotent(r, -1, 0, 2, argv, NULL, on_answer, &a) == TG_ERROR); /* no script -1 */
    ASSERT(tg_redis_command_idempotent(r, 0, NULL, NULL, on_answer, &a) == TG_ERROR);
    ASSERT_EQ_INT(a.calls, 1);
    /* A plain command through the same resend (what a lease's ZREM uses): sent once. */
    const char *push[3] = {"RPUSH", key, "y"};
    ASSERT(tg_redis_command_idempotent(r, 3, push, NULL, on_answer, &a) == TG_OK);
    ASSERT(run_until(&loop, &a.calls, 2, 5000));
    ASSERT(a.err == NULL);
    ASSERT_EQ_INT(runs(side, key), 2);
    ASSERT_EQ_INT(tg_redis_stats(r)->resends, 0);
    redisReply *del = redisCommand(side, "DEL %s", key);
    freeReplyObject(del);
    redisFree(side);
    finish(&loop, r);
}

TG_TEST(redis_resend, a_timed_out_script_is_sent_again) {
    const char *url = getenv("TOLLGATE_REDIS");
    if (!url)
        return;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 200);
    wait_connected(&loop, r);
    int id = tg_redis_script_register(r, RUNS_LUA);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:slow", (int)getpid());
    redisContext *side = side_connect(url);
    /* Redis answers nobody for 450 ms: the script times out after 200 ms (it runs when
     * the pause ends: its answer is lost, not its effect), and is sent again 0.5 s later. */
    side_do(side, "CLIENT PAUSE 450 ALL");
    const char *argv[2] = {key, "x"};
    answer_t a = {0};
    ASSERT(tg_redis_eval_idempotent(r, id, 1, 2, argv, NULL, on_answer, &a) == TG_OK);
    ASSERT(run_until(&loop, &a.calls, 1, 5000));
    ASSERT_EQ_INT(a.calls, 1);
    ASSERT(a.err == NULL);
    ASSERT(tg_redis_stats(r)->timeouts >= 1);
    ASSERT(tg_redis_stats(r)->resends >= 1);
    /* It ran once per send: the late first one and the resend (why it must be idempotent). */
    ASSERT_EQ_INT(a.integer, (long long)tg_redis_stats(r)->resends + 1);
    ASSERT_EQ_INT(runs(side, key), (long long)tg_redis_stats(r)->resends + 1);
    redisReply *del = redisCommand(side, "DEL %s", key);
    freeReplyObject(del);
    redisFree(side);
    finish(&loop, r);
}

TG_TEST(redis_resend, a_script_whose_connection_dropped_is_sent_again) {
    const char *url = getenv("TOLLGATE_REDIS");
    if (!url)
        return;
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, url, 2000);
    wait_connected(&loop, r);
    int id = tg_redis_script_register(r, RUNS_LUA);
    char key[64];
    snprintf(key, sizeof(key), "tg:unit:%d:dropped", (int)getpid());
    redisContext *side = side_connect(url);
    signal(SIGPIPE, SIG_IGN); /* as the gateway: a write on the killed socket is an error */
    char kill[64];
    snprintf(kill, sizeof(kill), "CLIENT KILL ID %lld", client_id(side));
    side_do(side, kill);
    /* The client learns of the kill on its next read: the script fails "disconnected"
     * (sent on the dead socket, or at once once the client knows), then is sent again on
     * the new connection. */
    const char *argv[2] = {key, "x"};
    answer_t a = {0};
    ASSERT(tg_redis_eval_idempotent(r, id, 1, 2, argv, NULL, on_answer, &a) == TG_OK);
    ASSERT(run_until(&loop, &a.calls, 1, 5000));
    ASSERT_EQ_INT(a.calls, 1);
    ASSERT(a.err == NULL);
    ASSERT(tg_redis_stats(r)->resends >= 1);
    ASSERT_EQ_INT(runs(side, key), 1);
    redisReply *del = redisCommand(side, "DEL %s", key);
    freeReplyObject(del);
    redisFree(side);
    finish(&loop, r);
}

TG_TEST(redis_resend, gives_up_after_the_last_resend) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, NO_SERVER, 200);
    int id = tg_redis_script_register(r, RUNS_LUA);
    const char *argv[2] = {"k", "x"};
    answer_t a = {0};
    uint64_t t0 = uv_hrtime();
    ASSERT(tg_redis_eval_idempotent(r, id, 1, 2, argv, NULL, on_answer, &a) == TG_OK);
    /* 0.5 + 1 + 2 + 4 + 8 s of waits between six sends. */
    ASSERT(run_until(&loop, &a.calls, 1, 30000));
    uint64_t ms = (uv_hrtime() - t0) / 1000000;
    ASSERT_EQ_INT(a.calls, 1);
    ASSERT(a.err == tg_redis_err_disconnected);
    ASSERT_EQ_INT(tg_redis_stats(r)->resends, TG_REDIS_RESEND_TRIES);
    /* The waits sum to 15.5 s; libuv's timers count from the loop's cached time, which
     * can be a few ms older than t0, so the whole can read a little under. */
    ASSERT(ms >= 15400 && ms < 25000);
    finish(&loop, r);
    ASSERT_EQ_INT(a.calls, 1);
}

TG_TEST(redis_resend, destroy_answers_those_waiting_and_the_wait_is_capped) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_redis_t *r = tg_redis_create(&loop, NO_SERVER, 200);
    int id = tg_redis_script_register(r, RUNS_LUA);
    const char *argv[2] = {"k", "x"};
    enum { N = TG_REDIS_RESEND_PENDING_MAX + 3 };
    static answer_t a[N];
    for (int i = 0; i < N; i++)
        ASSERT(tg_redis_eval_idempotent(r, id, 1, 2, argv, NULL, on_answer, &a[i]) == TG_OK);
    /* Every first send fails at once (no server); the first PENDING_MAX wait for their
     * resend, the three beyond the cap were sent once and have their answer. */
    int never = 0;
    run_until(&loop, &never, 1, 200);
    for (int i = 0; i < N; i++) {
        int beyond = i >= TG_REDIS_RESEND_PENDING_MAX;
        ASSERT_EQ_INT(a[i].calls, beyond);
        if (beyond)
            ASSERT(a[i].err == tg_redis_err_disconnected);
    }
    ASSERT_EQ_INT(tg_redis_stats(r)->resends, 0);
    /* Destroyed while they wait: each hears tg_redis_err_shutdown, once, from inside the
     * call; the loop then closes cleanly (every resend timer closed). */
    tg_redis_destroy(r);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ_INT(a[i].calls, 1);
        if (i < TG_REDIS_RESEND_PENDING_MAX)
            ASSERT(a[i].err == tg_redis_err_shutdown);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}
