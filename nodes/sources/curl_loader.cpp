// libcurl, loaded when first used. remote_store.cpp calls libcurl's API as declared in
// <curl/curl.h>; the definitions here forward each call to libcurl, opened with dlopen on the
// first call. Linked, libcurl and the ~35 libraries it needs (TLS, Kerberos, LDAP, SSH, IDN,
// HTTP/2, ...) were loaded, relocated and initialised by every flowstate process — ~20 ms of
// CPU before main on a 2-core VM, the largest part of a local run's start-up
// (bench/RESULTS.md, "Issue 26: W2 bars"). Now only a process that reads a remote path pays
// it, and a missing libcurl is an error naming the library (curl_easy_strerror) rather than a
// program that does not start.
//
// The definitions are weak, as the CUDA runtime's (nodes/cuda_runtime_loader.cpp): a program
// that links libcurl itself keeps its own, and these reach the same library through dlopen,
// which returns the handle already loaded.
#include <curl/curl.h>
#include <dlfcn.h>

#include <cstdarg>
#include <string>

#ifndef FLOWSTATE_CURL_SONAME
#error "FLOWSTATE_CURL_SONAME names libcurl (nodes/CMakeLists.txt)"
#endif

// <curl/curl.h> wraps the variadic calls in macros that check their argument count.
#undef curl_easy_setopt
#undef curl_easy_getinfo

namespace {

struct Library {
  void* handle = nullptr;
  std::string error;  ///< why it could not be loaded
};

const Library& library() {
  static const Library l = [] {
    Library out;
    out.handle = ::dlopen(FLOWSTATE_CURL_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef FLOWSTATE_CURL_BUILD_PATH
    // Not on the library path: the libcurl flowstate was built against.
    if (!out.handle) out.handle = ::dlopen(FLOWSTATE_CURL_BUILD_PATH, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!out.handle) {
      const char* why = ::dlerror();
      out.error = std::string("libcurl (" FLOWSTATE_CURL_SONAME
                              ", for remote paths) could not be loaded: ") +
                  (why ? why : "unknown reason");
    }
    return out;
  }();
  return l;
}

void* symbol(const char* name) {
  const Library& l = library();
  return l.handle ? ::dlsym(l.handle, name) : nullptr;
}

template <class Fn>
Fn* function(const char* name) {
  return reinterpret_cast<Fn*>(symbol(name));
}

// What a call returns when libcurl is missing; curl_easy_strerror gives the loader's reason.
constexpr CURLcode kMissing = CURLE_FAILED_INIT;

}  // namespace

extern "C" {

__attribute__((weak)) CURLcode curl_global_init(long flags) {
  static const auto fn = function<decltype(::curl_global_init)>("curl_global_init");
  return fn ? fn(flags) : kMissing;
}

__attribute__((weak)) CURL* curl_easy_init() {
  static const auto fn = function<decltype(::curl_easy_init)>("curl_easy_init");
  return fn ? fn() : nullptr;
}

__attribute__((weak)) void curl_easy_cleanup(CURL* handle) {
  static const auto fn = function<decltype(::curl_easy_cleanup)>("curl_easy_cleanup");
  if (fn) fn(handle);  // a handle exists only when libcurl was loaded
}

__attribute__((weak)) CURLcode curl_easy_perform(CURL* handle) {
  static const auto fn = function<decltype(::curl_easy_perform)>("curl_easy_perform");
  return fn ? fn(handle) : kMissing;
}

// The one argument after the option is of the type the option's number range says, as
// libcurl itself reads it: long, an object or function pointer, or curl_off_t.
__attribute__((weak)) CURLcode curl_easy_setopt(CURL* handle, CURLoption option, ...) {
  static const auto fn = function<decltype(::curl_easy_setopt)>("curl_easy_setopt");
  if (!fn) return kMissing;
  std::va_list ap;
  va_start(ap, option);
  CURLcode code;
  if (option < CURLOPTTYPE_OBJECTPOINT) {
    code = fn(handle, option, va_arg(ap, long));
  } else if (option < CURLOPTTYPE_FUNCTIONPOINT) {
    code = fn(handle, option, va_arg(ap, void*));
  } else if (option < CURLOPTTYPE_OFF_T) {
    code = fn(handle, option, va_arg(ap, void (*)()));
  } else if (option < CURLOPTTYPE_BLOB) {
    code = fn(handle, option, va_arg(ap, curl_off_t));
  } else {
    code = fn(handle, option, va_arg(ap, void*));  // a struct curl_blob*
  }
  va_end(ap);
  return code;
}

// Every CURLINFO_* takes a pointer to where the value goes.
__attribute__((weak)) CURLcode curl_easy_getinfo(CURL* handle, CURLINFO info, ...) {
  static const auto fn = function<decltype(::curl_easy_getinfo)>("curl_easy_getinfo");
  if (!fn) return kMissing;
  std::va_list ap;
  va_start(ap, info);
  const CURLcode code = fn(handle, info, va_arg(ap, void*));
  va_end(ap);
  return code;
}

__attribute__((weak)) const char* curl_easy_strerror(CURLcode code) {
  static const auto fn = function<decltype(::curl_easy_strerror)>("curl_easy_strerror");
  if (fn) return fn(code);
  return library().error.empty() ? "libcurl's curl_easy_strerror is missing"
                                 : library().error.c_str();
}

__attribute__((weak)) curl_slist* curl_slist_append(curl_slist* list, const char* text) {
  static const auto fn = function<decltype(::curl_slist_append)>("curl_slist_append");
  return fn ? fn(list, text) : nullptr;
}

__attribute__((weak)) void curl_slist_free_all(curl_slist* list) {
  static const auto fn = function<decltype(::curl_slist_free_all)>("curl_slist_free_all");
  if (fn) fn(list);
}

}  // extern "C"
