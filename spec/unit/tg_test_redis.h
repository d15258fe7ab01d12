/*
 * For the unit tests that run against a real Redis (TOLLGATE_REDIS): a blocking side
 * connection with hiredis's sync API, to look at or meddle with the server while the
 * code under test talks to it asynchronously.
 */
#ifndef TG_TEST_REDIS_H
#define TG_TEST_REDIS_H

#include <hiredis/hiredis.h>

#include "tg_test.h"

/* url: unix:///path/to.sock or redis://host[:port]. Fails the test if it cannot connect. */
static inline redisContext *side_connect(const char *url) {
    redisContext *c;
    if (strncmp(url, "unix://", 7) == 0) {
        c = redisConnectUnix(url + 7);
    } else {
        char host[256];
        int port = 6379;
        snprintf(host, sizeof(host), "%s", url + strlen("redis://"));
        char *colon = strrchr(host, ':');
        if (colon) {
            *colon = '\0';
            port = atoi(colon + 1);
        }
        c = redisConnect(host, port);
    }
    ASSERT(c && !c->err);
    return c;
}

#endif
