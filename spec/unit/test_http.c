/*
 * The request parser of a client connection (tg_server.c), driven without sockets
 * through tg_http_parse_for_fuzz: pipelining, limits and malformed input.
 */
#include "tg_test.h"
#include "tollgate/tg_server.h"

#define PARSE(s, h, b) tg_http_parse_for_fuzz((s), sizeof(s) - 1, (h), (b))

TG_TEST(http, one_request) {
    ASSERT_EQ_INT(PARSE("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 4096, 4096), 1);
}

TG_TEST(http, pipelined_requests_all_parsed_in_order) {
    ASSERT_EQ_INT(PARSE("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
                        "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                        "GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
                        4096, 4096),
                  3);
}

TG_TEST(http, chunked_body) {
    ASSERT_EQ_INT(PARSE("POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3\r\nabc\r\n0\r\n\r\n",
                        4096, 4096),
                  1);
}

TG_TEST(http, headers_too_large) {
    char req[8192];
    int n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nX-Big: ");
    memset(req + n, 'a', 5000);
    n += 5000;
    n += snprintf(req + n, sizeof(req) - (size_t)n, "\r\n\r\n");
    ASSERT_EQ_INT(tg_http_parse_for_fuzz(req, (size_t)n, 4096, 4096), -2);
}

TG_TEST(http, declared_body_too_large_refused_before_reading) {
    ASSERT_EQ_INT(PARSE("POST / HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", 4096, 1024), -3);
}

TG_TEST(http, chunked_body_too_large) {
    ASSERT_EQ_INT(PARSE("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "800\r\n" "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
                        4096, 16),
                  -3);
}

TG_TEST(http, garbage_is_a_protocol_error) {
    ASSERT_EQ_INT(PARSE("\x01\x02garbage\r\n\r\n", 4096, 4096), -1);
}

TG_TEST(http, conflicting_length_and_chunked_refused) {
    /* Request smuggling: strict llhttp refuses both framings at once. */
    ASSERT_EQ_INT(PARSE("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3\r\nabc\r\n0\r\n\r\n",
                        4096, 4096),
                  -1);
}

TG_TEST(http, negative_content_length_refused) {
    ASSERT_EQ_INT(PARSE("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 4096, 4096), -1);
}

TG_TEST(http, partial_request_is_not_dispatched) {
    ASSERT_EQ_INT(PARSE("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 4096, 4096), 0);
}
