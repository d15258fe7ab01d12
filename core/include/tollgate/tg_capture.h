/*
 * The capture: a sampled recorder of live policy decisions. A sampled request's hook
 * contexts (what each hook saw), the decisions made on it and its outcome are written
 * as one JSON line, in the format `tollgate policy test --requests` reads, to a
 * rotating file (config `plugins.capture`, README "Policies: capture, replay, shadow").
 *
 * Costs: off (rate 0 everywhere), a request pays one branch (tg_capture_enabled). On,
 * each request draws a random number; a sampled one builds its line on its worker
 * (a jansson tree) and hands the text to the writer thread, which alone touches the
 * file: no disk I/O on an event loop.
 *
 * Bounds: at most `max_per_s` requests are sampled per second (the whole instance);
 * a request is sampled only when the writer's queue has room for its line, which is
 * reserved at the decision, so a sampled request's line is never dropped. The file is
 * renamed to FILE.1 (FILE.1 to FILE.2, ... up to `keep`) past `max_bytes`.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef TOLLGATE_TG_CAPTURE_H
#define TOLLGATE_TG_CAPTURE_H

#include "tollgate/tg_config.h"

/** Non-zero while the recorder runs (read by tg_capture_enabled; do not write). */
extern int tg__capture_active;

/** The one branch a request pays when the capture is off. */
static inline int tg_capture_enabled(void) { return tg__capture_active; }

/**
 * Starts the recorder when cfg's rate (or a group's) is above 0: creates the file's
 * folder if needed, opens the file for appending and starts the writer thread.
 * Returns TG_OK (also when there is nothing to record), or TG_ERROR with a line in err.
 */
int tg_capture_start(const tg_capture_config_t *cfg, char *err, size_t errlen);
/** Writes what is queued, stops the writer and closes the file. */
void tg_capture_stop(void);

/**
 * Decides whether a request of group `group` (its name; "" none) is recorded: the
 * rate, then the per-second cap, then room in the queue. On 1 a line is owed: hand it
 * to tg_capture_submit, or call tg_capture_cancel. *seed gets the request's random seed.
 */
int tg_capture_sample(const char *group, uint32_t *seed);
/** Queues a sampled request's line (malloc'd, without newline; the recorder frees it). */
void tg_capture_submit(char *line, size_t len);
/** A sampled request ended without a line: its reserved room goes back. */
void tg_capture_cancel(void);

/** Whether header `name` (lower case, length n) may be recorded (the allow list). */
int tg_capture_header_allowed(const char *name, size_t n);

/**
 * GET /admin/api/v1/plugins/capture: a malloc'd JSON document (rate, cap, file,
 * counters: sampled, written, pending, skipped by the cap or a full queue, bytes,
 * rotations, write errors). The caller frees it.
 */
char *tg_capture_status_json(void);

/**
 * The current file's complete lines (what the writer has flushed), at most `max`
 * bytes from its end: a malloc'd buffer in *out with its length in *len. Returns
 * TG_OK, or TG_DECLINED when the capture is off, or TG_ERROR (errno-style message).
 */
int tg_capture_read(size_t max, char **out, size_t *len, char *err, size_t errlen);

#endif
