/*
 * Checks of text bound for upstream requests, logs and model names (see tg_valid.h).
 */
#include "tollgate/tg_valid.h"

#include <stdio.h>
#include <string.h>

const char *tg_valid_no_ctl(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return "contains a control character (CR, LF, NUL, ...)";
    }
    return NULL;
}

static int is_alnum(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

static int is_hex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* RFC 3986 pchar minus '%' (checked apart) plus '/'. */
static int is_path_char(unsigned char c) {
    return is_alnum(c) || (c && strchr("-._~!$&'()*+,;=:@/", c) != NULL);
}

const char *tg_valid_base_url(const char *s, size_t n) {
    if (n == 0)
        return "is empty";
    if (n > 2048)
        return "is longer than 2048 bytes";
    if (tg_valid_no_ctl(s, n))
        return "contains a control character (CR, LF, NUL, ...)";
    if (memchr(s, ' ', n))
        return "contains a space";
    size_t i;
    if (n >= 8 && !strncmp(s, "https://", 8))
        i = 8;
    else if (n >= 7 && !strncmp(s, "http://", 7))
        i = 7;
    else
        return "must start with http:// or https://";
    size_t host = i;
    if (i < n && s[i] == '[') {
        /* An IPv6 literal: hex digits, ':' and '.', then ']'. */
        i++;
        size_t start = i;
        while (i < n && (is_hex((unsigned char)s[i]) || s[i] == ':' || s[i] == '.'))
            i++;
        if (i == start || i >= n || s[i] != ']')
            return "has a malformed [IPv6] host";
        i++;
    } else {
        /* A DNS name or IPv4 address: labels of letters, digits, '-' and '_', split by '.'. */
        size_t label = 0;
        for (; i < n && s[i] != ':' && s[i] != '/'; i++) {
            unsigned char c = (unsigned char)s[i];
            if (c == '.') {
                if (label == 0)
                    return "has an empty label in its host";
                label = 0;
            } else if (is_alnum(c) || c == '-' || c == '_') {
                if (++label > 63)
                    return "has a host label longer than 63 bytes";
            } else if (c == '@') {
                return "must not carry user info (user@host)";
            } else if (c == '?' || c == '#') {
                return "must not have a query or fragment";
            } else {
                return "has a character not allowed in a host name";
            }
        }
        if (i == host)
            return "has no host";
    }
    if (i < n && s[i] == ':') {
        i++;
        long port = 0;
        size_t digits = 0;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, digits++)
            if ((port = port * 10 + (s[i] - '0')) > 65535)
                return "has a port above 65535";
        if (digits == 0 || port == 0)
            return "has a missing or zero port";
    }
    if (i - host >= 512)
        return "has a host and port of 512 bytes or more";
    if (i < n && s[i] != '/')
        return s[i] == '@' ? "must not carry user info (user@host)"
                           : s[i] == '?' || s[i] == '#' ? "must not have a query or fragment"
                                                        : "has a character not allowed after its host";
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n || !is_hex((unsigned char)s[i + 1]) || !is_hex((unsigned char)s[i + 2]))
                return "has a malformed percent-escape in its path";
            i += 2;
        } else if (c == '?' || c == '#') {
            return "must not have a query or fragment";
        } else if (!is_path_char(c)) {
            return "has a character not allowed in a URL path";
        }
    }
    return NULL;
}

const char *tg_valid_model(const char *s, size_t n) {
    if (n == 0)
        return "is empty";
    if (n > 256)
        return "is longer than 256 bytes";
    return tg_valid_no_ctl(s, n);
}

const char *tg_valid_timezone(const char *s, size_t n) {
    if (n == 0 || n > 63)
        return "must be an IANA time zone name of 1 to 63 characters, e.g. Europe/Berlin or UTC";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!is_alnum(c) && !strchr("/_+-", c))
            return "is not an IANA time zone name (letters, digits, '/', '_', '+', '-'), e.g. Europe/Berlin";
    }
    if (s[0] == '/' || memmem(s, n, "//", 2) || memmem(s, n, "/.", 2) || s[0] == '.' || s[0] == '-')
        return "is not an IANA time zone name, e.g. Europe/Berlin";
    if (!strcmp(s, "UTC"))
        return NULL;
    /* The system's time zone database: the zone's file must be there and be a TZif file. */
    char path[128];
    snprintf(path, sizeof(path), "/usr/share/zoneinfo/%.*s", (int)n, s);
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    int ok = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "TZif", 4);
    if (f)
        fclose(f);
    return ok ? NULL : "is not a time zone of this system's time zone database (/usr/share/zoneinfo), e.g. Europe/Berlin";
}
