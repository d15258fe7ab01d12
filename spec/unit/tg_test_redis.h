/*
 * For the unit tests that run against a real Redis (TOLLGATE_REDIS): a blocking side
 * connection with hiredis's sync API, to look at or meddle with the server while the
 * code under test talks to it asynchronously.
 */
#ifndef TG_TEST_REDIS_H
#define TG_TEST_REDIS_H

#include <hiredis/hiredis.h>

#include "tg_test.h"
#include "tollgate/tg_redis.h"

/* url: any URL the gateway takes (tg_redis_url_parse). Fails the test if it cannot
 * connect. */
static inline redisContext *side_connect(const char *url) {
    char err[400];
    redisContext *c = tg_redis_connect_sync(url, 5000, err, sizeof(err));
    if (!c)
        fprintf(stderr, "side connection: %s\n", err);
    ASSERT(c);
    return c;
}

#endif
