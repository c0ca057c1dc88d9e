// ThreadSanitizer support for an uninstrumented libtbb (Debian's libtbb12, oneTBB 2021.8).
//
// Linked ONLY into sanitizer=thread test executables. It defines the libtbb entry points that
// TBB's headers call (tbb::detail::r1::*) so that this executable's definitions interpose on
// libtbb's (libtbb calls them through its PLT as well), and forwards to the real functions via
// dlsym(RTLD_NEXT). It restores, for TSan, exactly the happens-before edges that oneTBB
// guarantees but that TSan cannot see inside the uninstrumented library:
//
//  * spawn/submit/enqueue(t)  happens-before  the start of t's execute()/cancel().
//    The task is wrapped in a TsanTask whose execute() acquires what the spawning thread
//    released. This is a per-task edge (not a global one), so unrelated tasks stay unordered
//    and races between them are still reported.
//  * The last wait_context::release()  happens-before  the return of wait()/execute_and_wait().
//    The headers' release() is an instrumented atomic RMW on m_ref_count; the waiter's load is
//    inside libtbb, so the shim acquires m_ref_count's address after the real wait returns.
//  * task_arena::execute(f): the caller happens-before f, f happens-before the return
//    (f may run on a worker thread when the caller cannot join the arena).
//  * Small-object pool: task memory is recycled through a lock-free pool inside libtbb; TSan
//    would see a new task written over an old one with no ordering. The shim routes
//    r1::allocate/deallocate to malloc/free, which TSan intercepts (a new block starts with
//    fresh shadow state). This adds no synchronisation at all.
//
// The only suppression is `called_from_lib:libtbb.so.12` (see __tsan_default_suppressions at the
// end): it ignores memory accesses made by interceptors (malloc/free/memcmp...) called directly
// from libtbb's own code, on libtbb's own data. Races in flowstate code, and in the
// instrumented TBB header code it instantiates, are still reported; tests/tsan/racy_loader.cpp
// proves it.

#if defined(__SANITIZE_THREAD__)  // GCC
#define FLOWSTATE_TSAN 1
#elif defined(__has_feature)  // Clang
#if __has_feature(thread_sanitizer)
#define FLOWSTATE_TSAN 1
#endif
#endif
#ifndef FLOWSTATE_TSAN
#error "tsan_tbb_shim.cpp must only be compiled with -fsanitize=thread"
#endif

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <oneapi/tbb/detail/_small_object_pool.h>
#include <oneapi/tbb/detail/_task.h>
#include <oneapi/tbb/detail/_utils.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/version.h>

#if TBB_INTERFACE_VERSION < 12000 || TBB_INTERFACE_VERSION >= 13000
#error "tsan_tbb_shim.cpp is written against the oneTBB 2021 (interface 12) ABI"
#endif

namespace d1 = tbb::detail::d1;

namespace {

template <typename Fn>
Fn real(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (!p) {
    std::fprintf(stderr, "tsan_tbb_shim: libtbb symbol %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

#define FLOWSTATE_REAL(var, type, mangled) static const auto var = real<type>(mangled)

// ---------------------------------------------------------------------------------------------
// Layout facts of the 2021 ABI that the shim relies on.
static_assert(sizeof(d1::task) == 64, "oneTBB d1::task layout changed");
static_assert(sizeof(d1::wait_context) == 16, "oneTBB d1::wait_context layout changed");

// d1::task is {vptr, task_traits::m_version_and_traits, m_reserved[6]}. Tasks with non-zero
// traits are libtbb's own special tasks (proxies, resume tasks...); they are passed through.
std::uint64_t task_traits_of(const d1::task& t) {
  std::uint64_t v;
  std::memcpy(&v, reinterpret_cast<const char*>(&t) + sizeof(void*), sizeof v);
  return v;
}

// wait_context is {m_version_and_traits, std::atomic<uint64_t> m_ref_count}.
void* ref_count_of(d1::wait_context& w) { return reinterpret_cast<char*>(&w) + 8; }

// ---------------------------------------------------------------------------------------------
// Per-task happens-before: the wrapper is released by the spawning thread and acquired by the
// executing thread before the wrapped task runs. The wrapper's own memory (malloc'd) is freed
// by the executing thread, which also clears TSan's sync state for that address.
class TsanTask final : public d1::task {
 public:
  static d1::task& wrap(d1::task& t) {
    if (task_traits_of(t) != 0) {
      __tsan_release(&t);
      return t;
    }
    auto* w = new TsanTask(t);
    __tsan_release(w);
    return *w;
  }

  d1::task* execute(d1::execution_data& ed) override {
    __tsan_acquire(this);
    d1::task* inner = inner_;
    delete this;
    return rewrap(inner->execute(ed));
  }

  d1::task* cancel(d1::execution_data& ed) override {
    __tsan_acquire(this);
    d1::task* inner = inner_;
    delete this;
    return rewrap(inner->cancel(ed));
  }

 private:
  explicit TsanTask(d1::task& inner) : inner_(&inner) {}
  ~TsanTask() override = default;

  // A bypassed task is normally run next by this thread, but the dispatcher may push it to
  // this thread's deque instead (e.g. when it picks a critical task first), where another
  // thread can steal it: wrap it too.
  static d1::task* rewrap(d1::task* next) { return next ? &wrap(*next) : nullptr; }

  d1::task* inner_;
};

// task_arena::execute(f): f runs on this thread or, when it cannot join the arena, on a worker.
class TsanDelegate final : public d1::delegate_base {
 public:
  explicit TsanDelegate(d1::delegate_base& inner) : inner_(inner) {}
  bool operator()() const override {
    __tsan_acquire(const_cast<TsanDelegate*>(this));
    bool r = inner_();
    __tsan_release(const_cast<TsanDelegate*>(this));
    return r;
  }

 private:
  d1::delegate_base& inner_;
};

// Any non-null value: allocate() must hand back a pool that deallocate() is later given.
alignas(64) unsigned char g_fake_pool[64];

void* pool_allocate(d1::small_object_pool*& pool, std::size_t n) {
  pool = reinterpret_cast<d1::small_object_pool*>(g_fake_pool);
  // Tasks are alignas(64); libtbb's pool hands out cache-line aligned blocks too.
  void* p = ::operator new (n, std::align_val_t{64});
  return p;
}

}  // namespace

namespace tbb::detail::r1 {

// ---- small-object pool -> malloc/free ---------------------------------------------------------

TBB_EXPORT void* __TBB_EXPORTED_FUNC allocate(d1::small_object_pool*& pool, std::size_t n,
                                              const d1::execution_data&) {
  return pool_allocate(pool, n);
}

TBB_EXPORT void* __TBB_EXPORTED_FUNC allocate(d1::small_object_pool*& pool, std::size_t n) {
  return pool_allocate(pool, n);
}

TBB_EXPORT void __TBB_EXPORTED_FUNC deallocate(d1::small_object_pool& pool, void* p, std::size_t,
                                               const d1::execution_data&) {
  if (reinterpret_cast<unsigned char*>(&pool) != g_fake_pool) std::abort();
  ::operator delete (p, std::align_val_t{64});
}

TBB_EXPORT void __TBB_EXPORTED_FUNC deallocate(d1::small_object_pool& pool, void* p, std::size_t) {
  if (reinterpret_cast<unsigned char*>(&pool) != g_fake_pool) std::abort();
  ::operator delete (p, std::align_val_t{64});
}

// ---- task submission: spawn/submit/enqueue happen-before execute ------------------------------

TBB_EXPORT void __TBB_EXPORTED_FUNC spawn(d1::task& t, d1::task_group_context& ctx) {
  using Fn = void (*)(d1::task&, d1::task_group_context&);
  FLOWSTATE_REAL(fn, Fn, "_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextE");
  fn(TsanTask::wrap(t), ctx);
}

TBB_EXPORT void __TBB_EXPORTED_FUNC spawn(d1::task& t, d1::task_group_context& ctx,
                                          d1::slot_id id) {
  using Fn = void (*)(d1::task&, d1::task_group_context&, d1::slot_id);
  FLOWSTATE_REAL(fn, Fn, "_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextEt");
  fn(TsanTask::wrap(t), ctx, id);
}

TBB_EXPORT void __TBB_EXPORTED_FUNC submit(d1::task& t, d1::task_group_context& ctx, arena* a,
                                           std::uintptr_t as_critical) {
  using Fn = void (*)(d1::task&, d1::task_group_context&, arena*, std::uintptr_t);
  FLOWSTATE_REAL(fn, Fn,
                 "_ZN3tbb6detail2r16submitERNS0_2d14taskERNS2_18task_group_contextEPNS1_5arenaEm");
  fn(TsanTask::wrap(t), ctx, a, as_critical);
}

TBB_EXPORT void __TBB_EXPORTED_FUNC enqueue(d1::task& t, d1::task_arena_base* ta) {
  using Fn = void (*)(d1::task&, d1::task_arena_base*);
  FLOWSTATE_REAL(fn, Fn, "_ZN3tbb6detail2r17enqueueERNS0_2d14taskEPNS2_15task_arena_baseE");
  fn(TsanTask::wrap(t), ta);
}

TBB_EXPORT void __TBB_EXPORTED_FUNC enqueue(d1::task& t, d1::task_group_context& ctx,
                                            d1::task_arena_base* ta) {
  using Fn = void (*)(d1::task&, d1::task_group_context&, d1::task_arena_base*);
  FLOWSTATE_REAL(
      fn, Fn,
      "_ZN3tbb6detail2r17enqueueERNS0_2d14taskERNS2_18task_group_contextEPNS2_15task_arena_baseE");
  fn(TsanTask::wrap(t), ctx, ta);
}

// ---- waiting: the last release of the wait_context happens-before the waiter's return ---------

TBB_EXPORT void __TBB_EXPORTED_FUNC execute_and_wait(d1::task& t, d1::task_group_context& t_ctx,
                                                     d1::wait_context& wait_ctx,
                                                     d1::task_group_context& w_ctx) {
  using Fn =
      void (*)(d1::task&, d1::task_group_context&, d1::wait_context&, d1::task_group_context&);
  FLOWSTATE_REAL(fn, Fn,
                 "_ZN3tbb6detail2r116execute_and_waitERNS0_2d14taskERNS2_18task_group_"
                 "contextERNS2_12wait_contextES6_");
  // t itself is run by this thread (program order); the tasks it spawns go through spawn().
  fn(t, t_ctx, wait_ctx, w_ctx);
  __tsan_acquire(ref_count_of(wait_ctx));
}

TBB_EXPORT void __TBB_EXPORTED_FUNC wait(d1::wait_context& wait_ctx, d1::task_group_context& ctx) {
  using Fn = void (*)(d1::wait_context&, d1::task_group_context&);
  FLOWSTATE_REAL(fn, Fn,
                 "_ZN3tbb6detail2r14waitERNS0_2d112wait_contextERNS2_18task_group_contextE");
  fn(wait_ctx, ctx);
  __tsan_acquire(ref_count_of(wait_ctx));
}

// ---- task_arena::execute ---------------------------------------------------------------------

TBB_EXPORT void __TBB_EXPORTED_FUNC execute(d1::task_arena_base& ta, d1::delegate_base& d) {
  using Fn = void (*)(d1::task_arena_base&, d1::delegate_base&);
  FLOWSTATE_REAL(fn, Fn,
                 "_ZN3tbb6detail2r17executeERNS0_2d115task_arena_baseERNS2_13delegate_baseE");
  // Heap-allocated so that its sync state is dropped by TSan when it is freed.
  auto* w = new TsanDelegate(d);
  __tsan_release(w);
  try {
    fn(ta, *w);
  } catch (...) {
    __tsan_acquire(w);
    delete w;
    throw;
  }
  __tsan_acquire(w);
  delete w;
}

}  // namespace tbb::detail::r1

// libtbb's own (uninstrumented) code calls intercepted functions on its private data, e.g.
// a memcmp and a delete[] of a libtbb-internal block in two TBB threads, ordered by libtbb's
// internal atomics that TSan cannot see. Ignore interceptor accesses made *from libtbb* only;
// flowstate code, TBB header code and other libraries are unaffected. Compiled in, so the test
// binaries are clean when run directly, without TSAN_OPTIONS.
extern "C" const char* __tsan_default_suppressions() { return "called_from_lib:libtbb.so.12\n"; }
