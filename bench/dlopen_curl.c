/* What loading libcurl costs a process (bench/RESULTS.md, "Issue 23: a warm cache"): times
 * dlopen("libcurl.so.4") — the library and the ~35 it needs — and curl_global_init, as
 * nodes/sources/curl_loader.cpp does on a process's first remote request.
 *
 *   cc -O2 bench/dlopen_curl.c -o /tmp/dlopen_curl -ldl && /tmp/dlopen_curl [lazy]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

typedef int (*init_fn)(long);

static double ms(const struct timespec* a, const struct timespec* b) {
  return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

int main(int argc, char** argv) {
  (void)argv;
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  void* lib = dlopen("libcurl.so.4", (argc > 1 ? RTLD_LAZY : RTLD_NOW) | RTLD_LOCAL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  init_fn init = (init_fn)dlsym(lib, "curl_global_init");
  if (!init || init(3) != 0) return 1;
  clock_gettime(CLOCK_MONOTONIC, &t2);
  printf("dlopen %.1f ms, curl_global_init %.1f ms\n", ms(&t0, &t1), ms(&t1, &t2));
  return 0;
}
