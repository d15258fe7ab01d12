/*
 * Checks of operator-supplied text that ends up in an upstream request line or header
 * (an account's base_url and credential) or in logs and model names. The admin API and
 * `tollgate apply` refuse such values on write (naming the field); the account loader
 * and the upstream client check them again before a request is built, so a value that
 * reached the database some other way is never sent.
 *
 * Each returns NULL when the value is acceptable, else a short reason ("contains a
 * control character", "has no host", ...) for the caller's error message.
 */
#ifndef TOLLGATE_TG_VALID_H
#define TOLLGATE_TG_VALID_H

#include <stddef.h>

/** No control byte (0x00-0x1f, 0x7f) anywhere: may stand in a header value or a log. */
const char *tg_valid_no_ctl(const char *s, size_t n);

/**
 * An upstream base URL: `http://` or `https://`, a host (a DNS name, an IPv4 address or
 * a bracketed IPv6 one), an optional `:port` (1-65535) and an optional path of URL path
 * characters (RFC 3986 pchar and '/', percent-escapes well formed). No user info, query,
 * fragment, space or control byte; at most 2048 bytes, the host and port under 512.
 */
const char *tg_valid_base_url(const char *s, size_t n);

/** A model name (a models entry, a model_map key or value): 1 to 256 bytes, no control byte. */
const char *tg_valid_model(const char *s, size_t n);

/** An IANA time zone name the system's database (/usr/share/zoneinfo) has ("UTC" always):
 *  NULL, or why not. Opens the zone's file: not for a request path. */
const char *tg_valid_timezone(const char *s, size_t n);

#endif
