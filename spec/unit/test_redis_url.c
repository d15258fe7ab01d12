/*
 * The one Redis URL parser (tg_redis_url_parse, core/src/io/tg_redis.c), used by the
 * workers' client and by `tollgate ledger`: every part of the URL is read, the password
 * and the database included, and anything else is refused.
 */
#include "tg_test.h"
#include "tollgate/tg_redis.h"

#define STR_OR_NULL(a, b) ASSERT(((a) == NULL && (b) == NULL) || ((a) && (b) && strcmp((a), (b)) == 0))

static void parses(const char *url, const char *host, const char *path, const char *user, const char *pass, int port,
                   int db) {
    tg_redis_url_t u;
    if (tg_redis_url_parse(url, &u) != TG_OK) {
        fprintf(stderr, "refused: %s\n", url);
        exit(1);
    }
    STR_OR_NULL(u.host, host);
    STR_OR_NULL(u.path, path);
    STR_OR_NULL(u.user, user);
    STR_OR_NULL(u.pass, pass);
    ASSERT_EQ_INT(u.port, port);
    ASSERT_EQ_INT(u.db, db);
    tg_redis_url_free(&u);
    ASSERT(u.host == NULL && u.pass == NULL);
}

TG_TEST(redis_url, every_part_is_read) {
    parses("redis://127.0.0.1", "127.0.0.1", NULL, NULL, NULL, 6379, 0);
    parses("redis://127.0.0.1:6380", "127.0.0.1", NULL, NULL, NULL, 6380, 0);
    parses("redis://localhost:6380/3", "localhost", NULL, NULL, NULL, 6380, 3);
    parses("redis://:s3cret@127.0.0.1:6380/2", "127.0.0.1", NULL, NULL, "s3cret", 6380, 2);
    parses("redis://ops:s3cret@127.0.0.1/5", "127.0.0.1", NULL, "ops", "s3cret", 6379, 5);
    parses("redis://s3cret@127.0.0.1", "127.0.0.1", NULL, NULL, "s3cret", 6379, 0); /* a password alone */
    parses("redis://:p@ss@127.0.0.1", "127.0.0.1", NULL, NULL, "p@ss", 6379, 0);     /* the last @ ends it */
    parses("redis://:a:b@[::1]:7000/1", "::1", NULL, NULL, "a:b", 7000, 1);
    parses("redis://127.0.0.1/", "127.0.0.1", NULL, NULL, NULL, 6379, 0);
    parses("unix:///tmp/x/redis.sock", NULL, "/tmp/x/redis.sock", NULL, NULL, 6379, 0);
}

TG_TEST(redis_url, anything_else_is_refused) {
    const char *bad[] = {NULL,
                         "",
                         "http://127.0.0.1",
                         "redis://",
                         "redis://:pw@",
                         "redis://host:0",
                         "redis://host:65536",
                         "redis://host:12x",
                         "redis://host:",
                         "redis://host/db3",
                         "redis://host/-1",
                         "redis://[::1",
                         "redis://[::1]x",
                         "unix://relative.sock",
                         /* TLS URLs take the same checks, and nothing near them passes */
                         "rediss://",
                         "rediss://:pw@",
                         "rediss://host:0",
                         "rediss://host:65536",
                         "rediss://host:1x",
                         "rediss://[::1",
                         "rediss://host/x",
                         "rediss:/host",
                         "rediss//host",
                         "redisss://host",
                         "rediss:host",
                         "redis",
                         "rediss",
                         "rediss-://host",
                         "rediss-clust://host",
                         "unixs:///tmp/r.sock"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tg_redis_url_t u;
        memset(&u, 0x5a, sizeof(u));
        if (tg_redis_url_parse(bad[i], &u) != TG_ERROR) {
            fprintf(stderr, "accepted: %s\n", bad[i] ? bad[i] : "(null)");
            exit(1);
        }
        ASSERT(u.host == NULL && u.path == NULL && u.user == NULL && u.pass == NULL);
    }
}

static void parses_tls(const char *url, const char *host, const char *pass, int port, int db) {
    tg_redis_url_t u;
    ASSERT_EQ_INT(tg_redis_url_parse(url, &u), TG_OK);
    ASSERT(u.tls == 1 && u.cluster == 0 && u.path == NULL);
    STR_OR_NULL(u.host, host);
    STR_OR_NULL(u.pass, pass);
    ASSERT_EQ_INT(u.port, port);
    ASSERT_EQ_INT(u.db, db);
    tg_redis_url_free(&u);
}

TG_TEST(redis_url, rediss_is_the_same_url_over_tls) {
    parses_tls("rediss://127.0.0.1:6380", "127.0.0.1", NULL, 6380, 0);
    parses_tls("rediss://redis.internal", "redis.internal", NULL, 6379, 0);
    parses_tls("rediss://ops:s3cret@[::1]:7000/2", "::1", "s3cret", 7000, 2);
    tg_redis_url_t u;
    ASSERT_EQ_INT(tg_redis_url_parse("redis://127.0.0.1:6380", &u), TG_OK);
    ASSERT(u.tls == 0);
    tg_redis_url_free(&u);
    /* A very long host or password is read as it is, not cut or overflowed. */
    char url[9000], host[4001];
    memset(host, 'h', sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    snprintf(url, sizeof(url), "rediss://:%s@%s:7000", host, host);
    parses_tls(url, host, host, 7000, 0);
}

TG_TEST(redis_url, rediss_without_tls_set_up_is_refused_clearly) {
    /* This process never called tg_redis_tls_setup (the config's redis_tls does). */
    char err[400];
    ASSERT(tg_redis_connect_sync("rediss://:hunter2@127.0.0.1:1", 500, err, sizeof(err)) == NULL);
    ASSERT(strstr(err, "TLS is not set up"));
    ASSERT(!strstr(err, "hunter2"));
    uv_loop_t loop;
    uv_loop_init(&loop);
    ASSERT(tg_redis_create(&loop, "rediss://:hunter2@127.0.0.1:1", 100) == NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}

TG_TEST(redis_url, connect_sync_names_the_place_not_the_password) {
    char err[400];
    ASSERT(tg_redis_connect_sync("http://x", 200, err, sizeof(err)) == NULL);
    ASSERT(strstr(err, "bad URL"));
    ASSERT(tg_redis_connect_sync("unix:///nonexistent-tollgate-dir/r.sock", 200, err, sizeof(err)) == NULL);
    ASSERT(strstr(err, "/nonexistent-tollgate-dir/r.sock"));
    /* Nothing listens on port 1 of 127.0.0.1. */
    ASSERT(tg_redis_connect_sync("redis://:hunter2@127.0.0.1:1/4", 500, err, sizeof(err)) == NULL);
    ASSERT(strstr(err, "127.0.0.1:1/4"));
    ASSERT(!strstr(err, "hunter2"));
}
