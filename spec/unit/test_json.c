/*
 * tg_json_set_members: the client's bytes with a few top-level members replaced must
 * parse (with jansson) to exactly the document jansson itself would produce by setting
 * those members, whatever the formatting, nesting and member order.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_json.h"

#include "tg_test.h"

/* The edit through tg_json_set_members equals the edit through jansson. */
static void check_edit(const char *doc, const char **keys, const char **vals, int n) {
    json_error_t err;
    json_t *want = json_loadb(doc, strlen(doc), JSON_REJECT_DUPLICATES, &err);
    ASSERT(want != NULL);
    for (int i = 0; i < n; i++)
        json_object_set_new(want, keys[i], json_loads(vals[i], JSON_DECODE_ANY, &err));
    tg_buf_t out;
    tg_buf_init(&out);
    ASSERT_EQ_INT(tg_json_set_members(doc, strlen(doc), keys, vals, n, &out), TG_OK);
    json_t *got = json_loadb(out.data, out.len, JSON_REJECT_DUPLICATES, &err);
    if (!got || !json_equal(got, want))
        fprintf(stderr, "doc: %s\nout: %.*s\n", doc, (int)out.len, out.data);
    ASSERT(got != NULL);
    ASSERT(json_equal(got, want));
    json_decref(got);
    json_decref(want);
    tg_buf_free(&out);
}

TG_TEST(json, replaces_and_adds_members) {
    const char *keys[] = {"model", "max_tokens", "stream_options"};
    const char *vals[] = {"\"gpt-4o\"", "4096", "{\"include_usage\":true}"};
    static const char *docs[] = {
        "{\"model\":\"alias\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        "{}",
        " { } ",
        "{\"messages\":[],\"model\":\"m\",\"max_tokens\":10,\"stream_options\":{\"include_usage\":false,\"x\":[1,{}]}}",
        "{\n  \"model\" : \"m\" ,\n  \"stream\" : true\n}\n",
        "{\"a\":\"}\\\"{[,\",\"model\":null,\"b\":[\"]\",{\"model\":1}],\"max_tokens\":-1.5e3}",
        "{\"stream_options\":null,\"model\":\"x\\\\\",\"z\":false}",
        "{\"nested\":{\"model\":\"inner\"},\"model\":\"outer\"}",
        "{\"max_tokens\":7}",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
        for (int n = 0; n <= 3; n++)
            check_edit(docs[i], keys, vals, n);
}

TG_TEST(json, escaped_top_level_keys_are_left_to_the_caller) {
    /* "mod\u0065l" is "model": editing by bytes could leave two models; refuse. */
    const char *doc = "{\"mod\\u0065l\":\"a\",\"messages\":[]}";
    const char *keys[] = {"model"};
    const char *vals[] = {"\"b\""};
    tg_buf_t out;
    tg_buf_init(&out);
    ASSERT_EQ_INT(tg_json_set_members(doc, strlen(doc), keys, vals, 1, &out), TG_ERROR);
    /* An escape inside a nested key or a value is fine. */
    const char *ok = "{\"x\":{\"mod\\u0065l\":1},\"y\":\"\\u0065\"}";
    ASSERT_EQ_INT(tg_json_set_members(ok, strlen(ok), keys, vals, 1, &out), TG_OK);
    tg_buf_free(&out);
}

/* A tiny deterministic generator of random JSON values, dumped with random formatting. */
static unsigned rng = 12345;
static unsigned next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

static json_t *random_value(int depth) {
    static const char *strs[] = {"", "model", "a\"b", "}{][,:", "\\", "\xc3\xa9t\xc3\xa9", "max_tokens", " "};
    switch (next() % (depth > 3 ? 4 : 6)) {
    case 0: return json_integer((json_int_t)(next() % 100000) - 50000);
    case 1: return json_string(strs[next() % 8]);
    case 2: return next() % 2 ? json_true() : json_null();
    case 3: return json_real((double)(next() % 1000) / 7.0);
    case 4: {
        json_t *a = json_array();
        for (unsigned i = next() % 4; i > 0; i--)
            json_array_append_new(a, random_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        static const char *ks[] = {"model", "max_tokens", "stream_options", "messages", "a", "b c", "}", "\"q\""};
        for (unsigned i = next() % 5; i > 0; i--)
            json_object_set_new(o, ks[next() % 8], random_value(depth + 1));
        return o;
    }
    }
}

TG_TEST(json, random_documents_agree_with_jansson) {
    const char *keys[] = {"model", "max_output_tokens", "stream_options"};
    const char *vals[] = {"\"mapped\"", "123", "{\"include_usage\":true,\"k\":[1,2]}"};
    static const size_t flags[] = {JSON_COMPACT, JSON_INDENT(2), 0, JSON_INDENT(1) | JSON_SORT_KEYS};
    for (int iter = 0; iter < 20000; iter++) {
        json_t *o = json_object();
        for (unsigned i = next() % 6; i > 0; i--) {
            static const char *top[] = {"model", "max_output_tokens", "stream_options", "messages", "input", "x"};
            json_object_set_new(o, top[next() % 6], random_value(1));
        }
        char *doc = json_dumps(o, flags[next() % 4]);
        check_edit(doc, keys, vals, (int)(next() % 4));
        free(doc);
        json_decref(o);
    }
}

/* ---- numbers kept as written (issue #15) -------------------------------------------- */

/* Parses `in` with tg_json_loadb and writes it back compact: must give `want`. */
static void check_round_trip(const char *in, const char *want) {
    json_error_t err;
    json_t *v = tg_json_loadb(in, strlen(in), JSON_REJECT_DUPLICATES, &err);
    if (!v)
        fprintf(stderr, "parse of %s: %s\n", in, err.text);
    ASSERT(v != NULL);
    char *s = tg_json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ASSERT(s != NULL);
    ASSERT_EQ_STR(s, want);
    free(s);
    json_decref(v);
}

TG_TEST(fidelity, json_integers_beyond_int64_are_kept) {
    check_round_trip("{\"maximum\": 18446744073709551615}", "{\"maximum\":18446744073709551615}");
    check_round_trip("[-9223372036854775809, 9223372036854775807, -9223372036854775808]",
                     "[-9223372036854775809,9223372036854775807,-9223372036854775808]");
    check_round_trip("{\"a\":[{\"b\":123456789012345678901234567890}],\"s\":\"18446744073709551616\"}",
                     "{\"a\":[{\"b\":123456789012345678901234567890}],\"s\":\"18446744073709551616\"}");
    json_error_t err;
    const char *doc = "{\"n\":18446744073709551616,\"m\":5}";
    json_t *v = tg_json_loadb(doc, strlen(doc), 0, &err);
    ASSERT(v != NULL);
    const char *t;
    size_t n;
    ASSERT(tg_json_is_big(json_object_get(v, "n"), &t, &n));
    ASSERT(n == 20 && !memcmp(t, "18446744073709551616", 20));
    ASSERT(!json_is_integer(json_object_get(v, "n")));
    ASSERT(!tg_json_is_big(json_object_get(v, "m"), NULL, NULL));
    ASSERT(json_integer_value(json_object_get(v, "m")) == 5);
    json_decref(v);
}

TG_TEST(fidelity, json_reals_in_shortest_form) {
    check_round_trip("{\"x\":0.1,\"y\":-2.5e-7,\"z\":1e20,\"w\":1.0,\"v\":100.25}",
                     "{\"x\":0.1,\"y\":-2.5e-7,\"z\":1e20,\"w\":1.0,\"v\":100.25}");
    check_round_trip("[0.30000000000000004, 3.141592653589793]", "[0.30000000000000004,3.141592653589793]");
    /* A string that looks like a number is left alone. */
    check_round_trip("[\"0.10000000000000001\", 1.5]", "[\"0.10000000000000001\",1.5]");
}

TG_TEST(fidelity, json_bad_numbers_still_fail) {
    json_error_t err;
    ASSERT(tg_json_loadb("{\"t\":1e400}", 11, 0, &err) == NULL);
    ASSERT(tg_json_loadb("{\"t\":18446744073709551616", 25, 0, &err) == NULL);
    ASSERT(tg_json_loadb("{\"t\":01}", 8, 0, &err) == NULL);
    /* A client string cannot pose as a big number: its marker starts with a NUL, which
     * jansson refuses in client strings, also when a big number made the rewrite run. */
    const char *in = "{\"s\":\"\\u0000tgbig:12\"}";
    ASSERT(tg_json_loadb(in, strlen(in), 0, &err) == NULL);
    in = "{\"n\":18446744073709551616,\"s\":\"\\u0000tgbig:12\"}"; /* the rewrite runs first */
    ASSERT(tg_json_loadb(in, strlen(in), 0, &err) == NULL);
    in = "{\"s\":\"tgbig:12 \\\\u0000\",\"n\":18446744073709551616}"; /* an escaped backslash, no NUL */
    json_t *v = tg_json_loadb(in, strlen(in), 0, &err);
    ASSERT(v != NULL);
    ASSERT(!tg_json_is_big(json_object_get(v, "s"), NULL, NULL));
    ASSERT(tg_json_is_big(json_object_get(v, "n"), NULL, NULL));
    char *s = tg_json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    ASSERT_EQ_STR(s, "{\"n\":18446744073709551616,\"s\":\"tgbig:12 \\\\u0000\"}");
    free(s);
    json_decref(v);
}
