/*
 * Account health: EWMAs, cooldown that only extends, half-open trials.
 */
#include "tg_test.h"
#include "tollgate/tg_health.h"

TG_TEST(health, ewma_and_many_accounts) {
    tg_health_t *h = tg_health_create();
    for (int64_t id = 1; id <= 5000; id++)
        tg_health_get(h, id)->inflight = (int)id;
    for (int64_t id = 1; id <= 5000; id++)
        ASSERT_EQ_INT(tg_health_get(h, id)->inflight, id);
    tg_health_entry_t *e = tg_health_get(h, 42);
    e->inflight = 0;
    for (int i = 0; i < 20; i++) {
        tg_health_begin(e);
        tg_health_end(e, 0, -1);
    }
    ASSERT(e->err_ewma > 0.95);
    for (int i = 0; i < 20; i++) {
        tg_health_begin(e);
        tg_health_end(e, 1, 100);
    }
    ASSERT(e->err_ewma < 0.05);
    ASSERT(e->ttft_ewma_ms > 99 && e->ttft_ewma_ms < 101);
    ASSERT_EQ_INT(e->inflight, 0);
    tg_health_destroy(h);
}

TG_TEST(health, cooldown_extends_never_shortens_and_probes_once) {
    tg_health_t *h = tg_health_create();
    tg_health_entry_t *e = tg_health_get(h, 7);
    ASSERT_EQ_INT(tg_health_cool(e, 1000, 5000), 6000);
    ASSERT_EQ_INT(tg_health_cool(e, 1000, 1000), 6000); /* shorter: ignored */
    ASSERT_EQ_INT(tg_health_available(e, 5999), 0);
    ASSERT_EQ_INT(tg_health_available(e, 6000), 1);    /* half-open */
    tg_health_begin(e);                                  /* the trial */
    ASSERT_EQ_INT(tg_health_available(e, 6001), 0);    /* one trial at a time */
    tg_health_end(e, 0, -1);                             /* it failed */
    ASSERT_EQ_INT(tg_health_cool(e, 6001, 1000), 6001 + 10000); /* doubled */
    ASSERT_EQ_INT(tg_health_available(e, 16001), 1);
    tg_health_begin(e);
    tg_health_end(e, 1, 50);                             /* the trial succeeded */
    ASSERT_EQ_INT(e->cooldown_until_ms, 0);
    ASSERT_EQ_INT(tg_health_available(e, 16002), 1);
    tg_health_begin(e);
    ASSERT_EQ_INT(tg_health_available(e, 16002), 1);   /* healthy: no trial limit */
    tg_health_destroy(h);
}
