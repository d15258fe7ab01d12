/*
 * The unit-test runner. `tg_unit MODULE` runs the tests of one module, `tg_unit` all of
 * them; each test runs in a forked child with a 60 s alarm.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tg_test.h"

typedef struct {
    const char *module, *name;
    tg_test_fn fn;
} tg_test_t;

static tg_test_t tests[1024];
static int ntests;

void tg_test_register(const char *module, const char *name, tg_test_fn fn) {
    if (ntests < (int)(sizeof(tests) / sizeof(tests[0])))
        tests[ntests++] = (tg_test_t){module, name, fn};
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 0; i < ntests; i++) {
        if (argc > 1 && strcmp(argv[1], tests[i].module) != 0)
            continue;
        if (argc > 2 && strcmp(argv[2], tests[i].name) != 0)
            continue;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(60);
            tests[i].fn();
            exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        printf("%s %s.%s", ok ? "ok  " : "FAIL", tests[i].module, tests[i].name);
        if (!ok && WIFSIGNALED(st))
            printf(" (signal %d)", WTERMSIG(st));
        printf("\n");
        ok ? passed++ : failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed || passed == 0 ? 1 : 0;
}
