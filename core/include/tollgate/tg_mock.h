/*
 * `tollgate mock-upstream`: a fast, deterministic fake OpenAI/Anthropic provider used
 * by tests, benchmarks and the quickstart. See core/src/mock/tg_mock.c for its knobs.
 */
#ifndef TOLLGATE_TG_MOCK_H
#define TOLLGATE_TG_MOCK_H

/** Runs the mock until SIGTERM/SIGINT. argv[0] is "mock-upstream". Returns the exit code. */
int tg_mock_main(int argc, char **argv);

#endif
