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
                         "rediss://host"};
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
