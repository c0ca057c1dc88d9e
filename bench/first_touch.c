/* What a process's first touch of a mapped file's pages costs (bench/RESULTS.md, "Issue 26:
 * W2 bars"): maps FILE read-only, optionally populates the page tables (MAP_POPULATE) or has a
 * second thread touch a byte per page first, then times a first and a second pass of 8-byte
 * loads over the whole file on the main thread.
 *
 *   gcc -O2 -pthread bench/first_touch.c -o /tmp/first_touch
 *   /tmp/first_touch /tmp/flowstate-w2/corpus.bin [map|populate|touch]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static const unsigned char* data;
static off_t size;

static void* touch(void* unused) {
  (void)unused;
  volatile unsigned sum = 0;
  const double t0 = now();
  for (off_t i = 0; i < size; i += 4096) sum += data[i];
  printf("touch thread: %.1f ms\n", (now() - t0) * 1e3);
  return NULL;
}

static uint64_t pass(void) {
  uint64_t sum = 0;
  for (off_t i = 0; i + 8 <= size; i += 8) {
    uint64_t v;
    memcpy(&v, data + i, 8);
    sum += v;
  }
  return sum;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: first_touch FILE [map|populate|touch]\n");
    return 2;
  }
  const char* mode = argc > 2 ? argv[2] : "map";
  const int fd = open(argv[1], O_RDONLY);
  if (fd < 0) {
    perror(argv[1]);
    return 1;
  }
  size = lseek(fd, 0, SEEK_END);
  const double t0 = now();
  const int flags = MAP_PRIVATE | (strcmp(mode, "populate") == 0 ? MAP_POPULATE : 0);
  data = mmap(NULL, (size_t)size, PROT_READ, flags, fd, 0);
  if (data == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  const double t1 = now();
  if (strcmp(mode, "touch") == 0) {
    pthread_t t;
    pthread_create(&t, NULL, touch, NULL);
    pthread_join(t, NULL);
  }
  const double t2 = now();
  const uint64_t a = pass();
  const double t3 = now();
  const uint64_t b = pass();
  const double t4 = now();
  printf("%s: mmap %.1f ms, first pass %.1f ms, second pass %.1f ms (%d)\n", mode, (t1 - t0) * 1e3,
         (t3 - t2) * 1e3, (t4 - t3) * 1e3, (int)((a ^ b) & 1));
  return 0;
}
