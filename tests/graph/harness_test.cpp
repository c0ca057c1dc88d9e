// The bench harness's verdict: the bottleneck line from the stages of the median run.
#include "flowstate/graph/harness.h"

#include <gtest/gtest.h>

namespace flowstate::bench {
namespace {

BenchReport report_of(RunReport run) {
  BenchReport r;
  run.samples_per_s = 100;
  r.runs.push_back(std::move(run));
  r.samples_per_s = summarize({100});
  return r;
}

TEST(BenchHarness, NamesTheBusiestStageAsTheBottleneck) {
  RunReport run;
  run.stages = {{.name = "spine", .concurrency = 1, .utilization = 0.10},
                {.name = "assemble", .concurrency = 2, .utilization = 0.92},
                {.name = "deliver", .concurrency = 1, .utilization = 0.05}};
  run.consumer_waits = 40;
  run.graph_waits = 0;
  const BenchReport r = report_of(run);
  EXPECT_EQ(bottleneck(r), "bottleneck: assemble (92% busy on 2 workers)");
  EXPECT_NE(format_report(r).find("\nbottleneck: assemble (92% busy on 2 workers)\n"),
            std::string::npos);
  run.stages[1].utilization = 0.2;
  run.stages[0].utilization = 0.97;
  EXPECT_EQ(bottleneck(report_of(run)), "bottleneck: spine (97% busy on 1 worker)");
}

TEST(BenchHarness, NamesTheConsumerWhenTheGraphWaitsOnIt) {
  RunReport run;
  run.stages = {{.name = "assemble", .concurrency = 2, .utilization = 0.3}};
  run.consumer_waits = 2;
  run.graph_waits = 180;
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: the consumer (the graph waited on it 180 times, it on the graph 2)");
  EXPECT_EQ(bottleneck(BenchReport{}), "");
}

}  // namespace
}  // namespace flowstate::bench
