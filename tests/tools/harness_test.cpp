// The bench harness's verdict: the bottleneck line from the stages and nodes of the median run.
#include "flowstate/tools/harness.h"

#include <gtest/gtest.h>

namespace flowstate::bench {
namespace {

BenchReport report_of(RunReport run) {
  BenchReport r;
  run.samples_per_s = 100;
  run.seconds = 10;
  r.runs.push_back(std::move(run));
  r.samples_per_s = summarize({100});
  return r;
}

RunReport map_heavy_run() {
  RunReport run;
  run.stages = {{.name = "spine", .concurrency = 1, .utilization = 0.10},
                {.name = "assemble", .concurrency = 2, .utilization = 0.94},
                {.name = "deliver", .concurrency = 1, .utilization = 0.05}};
  run.nodes = {{.name = "records", .stage = "spine", .spine_s = 0.2, .assemble_s = 4.0},
               {.name = "shuffle", .stage = "spine", .spine_s = 0.8},
               {.name = "map:augment", .stage = "assemble", .threads = 2, .assemble_s = 14.2},
               {.name = "batch", .stage = "assemble", .threads = 2, .assemble_s = 0.6}};
  run.consumer_waits = 40;
  return run;
}

TEST(BenchHarness, NamesTheBusiestNodeOfTheBusiestStage) {
  const BenchReport r = report_of(map_heavy_run());
  const std::string line =
      "bottleneck: map:augment — 71% busy on 2 workers (the workers 94% busy); more workers "
      "would help";
  EXPECT_EQ(bottleneck(r), line);
  EXPECT_NE(format_report(r).find("\n" + line + "\n"), std::string::npos);
}

TEST(BenchHarness, SaysMoreWorkersWouldNotHelpASerialSpine) {
  RunReport run = map_heavy_run();
  run.stages[0].utilization = 0.97;
  run.stages[1].utilization = 0.2;
  run.nodes[1].spine_s = 8.1;
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: shuffle — 81% busy in the spine (serial, 97% busy); more workers would "
            "not help");
}

TEST(BenchHarness, PassesOverADeliverStageWhereNoNodeWorks) {
  // Without device_copy, deliver only hands batches over; a busy hand-off is not a node.
  RunReport run = map_heavy_run();
  run.stages[2].utilization = 0.99;
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: map:augment — 71% busy on 2 workers (the workers 94% busy); more workers "
            "would help");
  run.nodes.push_back({.name = "device_copy", .stage = "deliver", .deliver_s = 9.0});
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: device_copy — 90% busy in deliver (serial, 99% busy)");
}

TEST(BenchHarness, AnInlineRunsVerdictIsOfTheConsumersThread) {
  // workers: inline: no worker would help; the stages share the consumer's one thread.
  RunReport run;
  run.workers_inline = true;
  run.stages = {{.name = "spine", .concurrency = 1, .utilization = 0.16},
                {.name = "assemble", .concurrency = 1, .utilization = 0.70},
                {.name = "deliver", .concurrency = 1, .utilization = 0.0}};
  run.nodes = {{.name = "shuffle", .stage = "spine", .spine_s = 0.3},
               {.name = "pack", .stage = "spine", .spine_s = 1.3, .assemble_s = 6.7}};
  run.consumer_busy_s = 1.0;  // of 10 s
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: pack — 67% busy on the consumer's thread, which makes the batches "
            "(workers: inline; the consumer 10% busy); worker threads (workers: N) would make "
            "them beside the consumer's own work");
}

TEST(BenchHarness, PrintsOneVerdictAndATableOfEveryNode) {
  const std::string text = format_report(report_of(map_heavy_run()));
  for (const char* node : {"\nrecords ", "\nshuffle ", "\nmap:augment ", "\nbatch ", "\nconsumer "})
    EXPECT_NE(text.find(node), std::string::npos) << node << " in\n" << text;
  EXPECT_EQ(text.find("pipeline-bound"), std::string::npos) << text;
  EXPECT_EQ(text.find("consumer-bound"), std::string::npos) << text;
  std::size_t verdicts = 0;
  for (std::size_t at = text.find("bottleneck:"); at != std::string::npos;
       at = text.find("bottleneck:", at + 1))
    ++verdicts;
  EXPECT_EQ(verdicts, 1u) << text;
}

TEST(BenchHarness, NamesTheConsumerWhenTheGraphWaitsOnIt) {
  RunReport run;
  run.stages = {{.name = "assemble", .concurrency = 2, .utilization = 0.3}};
  run.consumer_waits = 2;
  run.graph_waits = 180;
  run.consumer_busy_s = 9.1;  // of 10 s
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: the consumer — 91% busy, the graph waited on it 180 times, it on the "
            "graph 2");
  EXPECT_EQ(bottleneck(BenchReport{}), "");
}

TEST(BenchHarness, NeverNamesAnIdleConsumer) {
  // The graph waited on the consumer (the hand-off), but the consumer was 1% busy and the
  // workers 94%: the workers' busiest node is the bottleneck.
  RunReport run = map_heavy_run();
  run.consumer_waits = 2;
  run.graph_waits = 180;
  run.consumer_busy_s = 0.1;
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: map:augment — 71% busy on 2 workers (the workers 94% busy); more workers "
            "would help");
  // Nothing busy most of the time: said so, with the busiest named.
  run.stages[1].utilization = 0.3;
  run.nodes[2].assemble_s = 5.0;
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: none saturated — the busiest, map:augment, is 25% busy on 2 workers (the "
            "assemble stage 30% busy); the consumer 1% busy");
}

TEST(BenchHarness, SaysSoWhenNoNodeWorkedWhileTheBatchesWereTimed) {
  // A short run: the graph made the timed batches during the warm-up.
  RunReport run = map_heavy_run();
  for (auto& n : run.nodes) n.spine_s = n.assemble_s = n.deliver_s = 0;
  EXPECT_EQ(bottleneck(report_of(run)),
            "bottleneck: not measured — no node worked while the batches were timed (the graph "
            "had made them ahead); time more batches (--steps)");
}

}  // namespace
}  // namespace flowstate::bench
