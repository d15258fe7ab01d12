/*
 * tg_valid: the checks of text bound for upstream request lines and headers.
 */
#include "tg_test.h"
#include "tollgate/tg_valid.h"

#define OK_URL(s) ASSERT(tg_valid_base_url((s), strlen(s)) == NULL)
#define BAD_URL(s) ASSERT(tg_valid_base_url((s), strlen(s)) != NULL)

TG_TEST(valid, base_url_accepts_clean_urls) {
    OK_URL("http://127.0.0.1:8080/v1");
    OK_URL("https://api.openai.com/v1");
    OK_URL("https://api.anthropic.com");
    OK_URL("http://localhost:1/");
    OK_URL("http://[::1]:9000/v1");
    OK_URL("https://gateway.example.com/openai/deployments/my-model_1/v1");
    OK_URL("https://host/a%2Fb/~x/@y/:z;p=1");
    OK_URL("http://host.example.com./v1");
}

TG_TEST(valid, base_url_refuses_what_breaks_a_request) {
    BAD_URL("");
    BAD_URL("ftp://host/v1");
    BAD_URL("javascript:alert(1)");
    BAD_URL("http://");
    BAD_URL("http:///v1");
    BAD_URL("http://host/v1\r\nX-Injected: 1");
    BAD_URL("http://host\r\nX-Injected: 1/v1");
    BAD_URL("http://host/v1\nX");
    BAD_URL("http://host/v1 HTTP/1.1");
    BAD_URL("http://host/v1\tx");
    BAD_URL("http://user:pw@host/v1");
    BAD_URL("http://host/v1?x=1");
    BAD_URL("http://host/v1#f");
    BAD_URL("http://host:0/v1");
    BAD_URL("http://host:65536/v1");
    BAD_URL("http://host:/v1");
    BAD_URL("http://host:80x/v1");
    BAD_URL("http://ho st/v1");
    BAD_URL("http://a..b/v1");
    BAD_URL("http://[::1/v1");
    BAD_URL("http://[]/v1");
    BAD_URL("http://host/%zz");
    BAD_URL("http://host/%4");
    BAD_URL("http://host/a\"b");
    BAD_URL("http://host/a<b>");
    /* An embedded NUL is seen (the length is given). */
    ASSERT(tg_valid_base_url("http://host/v1\0\r\nX: 1", 21) != NULL);
    char longurl[2100];
    memset(longurl, 'a', sizeof(longurl));
    memcpy(longurl, "http://h/", 9);
    ASSERT(tg_valid_base_url(longurl, sizeof(longurl)) != NULL);
}

TG_TEST(valid, control_bytes_and_models) {
    ASSERT(tg_valid_no_ctl("sk-abc def", 10) == NULL);
    ASSERT(tg_valid_no_ctl("sk-\r\n", 5) != NULL);
    ASSERT(tg_valid_no_ctl("sk\x7f", 3) != NULL);
    ASSERT(tg_valid_no_ctl("a\0b", 3) != NULL);
    ASSERT(tg_valid_no_ctl("caf\xc3\xa9", 5) == NULL); /* UTF-8 passes */
    ASSERT(tg_valid_model("gpt-4o", 6) == NULL);
    ASSERT(tg_valid_model("", 0) != NULL);
    ASSERT(tg_valid_model("m\n", 2) != NULL);
    char big[257];
    memset(big, 'm', sizeof(big));
    ASSERT(tg_valid_model(big, 256) == NULL);
    ASSERT(tg_valid_model(big, 257) != NULL);
}
