/*
 * A connection's one timeout on one libuv timer, re-armed lazily: what the server's
 * connections (tg_server.c: header, body, idle, write) and the upstream calls
 * (tg_upstream.c: connect, first byte, idle, the pooled keep-alive) share.
 *
 * Each of them moves its timeout several times a request, nearly always later. Moving a
 * libuv timer is a heap operation (~350 instructions); here a later deadline is only
 * stored, and the timer is re-armed only when the deadline moves earlier than the time
 * it is armed for. When it fires before the deadline it arms itself for what is left
 * (tg_timeout_fired returns 0 then). Internal to core/src/http.
 */
#ifndef TG_TIMEOUT_INTERNAL_H
#define TG_TIMEOUT_INTERNAL_H

#include <stdint.h>
#include <uv.h>

typedef struct {
    uint64_t deadline; /* loop time the timeout ends at; 0: none */
    uint64_t due;      /* loop time the timer is armed for, while it is active */
} tg_timeout_t;

/* Arms the timer for ms from now whatever it was armed for (a timer that is not a
 * deadline: the lingering close's gaps). */
static inline void tg_timeout_arm(tg_timeout_t *to, uv_timer_t *t, uv_timer_cb cb, uint64_t ms) {
    to->due = uv_now(t->loop) + ms;
    uv_timer_start(t, cb, ms, 0);
}

/* The timeout ends ms from now, replacing any other. */
static inline void tg_timeout_set(tg_timeout_t *to, uv_timer_t *t, uv_timer_cb cb, uint64_t ms) {
    uint64_t due = uv_now(t->loop) + ms;
    to->deadline = due;
    if (!uv_is_active((const uv_handle_t *)t) || to->due > due)
        tg_timeout_arm(to, t, cb, ms);
}

/* No timeout (the timer, if armed, fires and does nothing). */
static inline void tg_timeout_clear(tg_timeout_t *to) { to->deadline = 0; }

/* In the timer's callback: 1 when the timeout has ended (it is cleared), 0 when there
 * is none or it moved later (the timer is armed again for what is left). */
static inline int tg_timeout_fired(tg_timeout_t *to, uv_timer_t *t, uv_timer_cb cb) {
    if (!to->deadline)
        return 0;
    uint64_t now = uv_now(t->loop);
    if (now < to->deadline) {
        tg_timeout_arm(to, t, cb, to->deadline - now);
        return 0;
    }
    to->deadline = 0;
    return 1;
}

#endif
