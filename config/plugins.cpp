#include "flowstate/config/plugins.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

std::mutex& plugins_mutex() {
  static std::mutex mu;
  return mu;
}

std::vector<std::string>& loaded() {
  static std::vector<std::string> paths;
  return paths;
}

}  // namespace

void load_plugin(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path, ec);
  const std::string key = ec ? path : canonical.string();
  std::lock_guard lock(plugins_mutex());
  for (const auto& p : loaded())
    if (p == key) return;
  if (!std::filesystem::exists(key))
    throw ConfigError("plugins", "plugin '" + path + "' does not exist");
  // RTLD_GLOBAL: a plugin's own dependencies may be shared with later plugins.
  void* handle = ::dlopen(key.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw ConfigError("plugins", "cannot load plugin '" + path + "': " + (why ? why : "unknown"));
  }
  using Entry = void (*)(PluginRegistry&);
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, kPluginEntryPoint));
  if (entry == nullptr)
    throw ConfigError("plugins", "plugin '" + path + "' exports no " +
                                     std::string(kPluginEntryPoint) + " function");
  PluginRegistry r{Registry::global(), TransformRegistry::global(), key};
  try {
    entry(r);
  } catch (const std::exception& e) {
    throw ConfigError("plugins", "plugin '" + path + "' failed to register: " + e.what());
  }
  loaded().push_back(key);
}

std::vector<std::string> loaded_plugins() {
  std::lock_guard lock(plugins_mutex());
  return loaded();
}

}  // namespace flowstate
