// Uses the installed library through its umbrella header: a pipeline over the program's own
// container and a YAML pipeline, a checkpoint, and a resume that continues exactly.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <flowstate/flowstate.h>
#include "core/tensor.h"  // the app's own, not flowstate's

#ifndef APP_OWN_CORE_TENSOR_H
#error "core/tensor.h resolved to flowstate's header, not the application's"
#endif

namespace fs = std::filesystem;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

std::vector<int> values(const flowstate::Batch& b) {
  // Collate<int> stacks the batch's ints into one int32 Tensor, the batch's user value.
  const flowstate::Tensor& t = b.user.get<flowstate::Tensor>();
  const int* p = static_cast<const int*>(t.data());
  return std::vector<int>(p, p + t.numel());
}

flowstate::Pipeline make(const std::vector<int>& numbers) {
  return flowstate::Pipeline::Builder()
      .seed(3)
      .source(flowstate::from_range(numbers, {.name = "numbers"}))
      .shuffle({})
      .batch({.size = 4})
      .build();
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path work = argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "consumer";
  fs::remove_all(work);
  fs::create_directories(work);
  app::Tensor mine{.rows = 2};
  expect(mine.rows == 2, "the app's own Tensor");

  std::vector<int> numbers;
  for (int i = 0; i < 40; ++i) numbers.push_back(i);

  // Uninterrupted: two epochs of 10 batches.
  std::vector<std::vector<int>> all;
  {
    flowstate::Loader l(make(numbers), {.epochs = 2});
    while (auto b = l.next()) all.push_back(values(*b));
  }
  expect(all.size() == 20, "20 batches, got " + std::to_string(all.size()));

  // Interrupted after 13 batches, checkpointed, resumed in a new Loader.
  std::vector<std::vector<int>> resumed;
  {
    flowstate::Loader l(make(numbers), {.epochs = 2});
    for (int i = 0; i < 13; ++i) resumed.push_back(values(*l.next()));
    l.save_checkpoint((work / "ckpt").string());
  }
  {
    flowstate::Loader l(make(numbers), {.epochs = 2});
    expect(l.restore((work / "ckpt").string()).has_value(), "restore finds the checkpoint");
    while (auto b = l.next()) resumed.push_back(values(*b));
  }
  expect(resumed == all, "the resumed run delivers the uninterrupted run's batches");

  // A YAML pipeline through the same registry the flowstate command uses.
  try {
    flowstate::from_yaml_string(
        "source: {type: records, paths: \"data/*.bin\", record_bytes: 16}\n"
        "nodes:\n  - batch: {size: 0}\n",
        "consumer.yaml");
    expect(false, "a bad YAML pipeline is refused");
  } catch (const flowstate::ConfigError& e) {
    const std::string what = e.what();
    expect(
        what.find("consumer.yaml") != std::string::npos && what.find("size") != std::string::npos,
        "the refusal names the file and the key: " + what);
  }

  if (failures == 0) std::printf("consumer: OK (%zu batches, resume exact)\n", all.size());
  return failures == 0 ? 0 : 1;
}
