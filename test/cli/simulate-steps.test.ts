import { describe, expect, it } from "vitest";
import { runRequests } from "../../cli/simulate.ts";
import { PRESETS, presetConfig } from "../../controller/simulator/index.ts";

describe("simulate's run requests", () => {
  it("numbers a run per variant, then load, then system, each variant on traces drawn for its hosts", () => {
    const config = presetConfig(PRESETS.small);
    const drawnFor: number[] = [];
    const traces = (hosts: number) => {
      drawnFor.push(hosts);
      return [
        { load: 0.5, jobs: [] },
        { load: 0.9, jobs: [] },
      ];
    };
    const settings = [
      { name: "a", config, hosts: 16 },
      { name: "b", config, hosts: 32 },
    ];
    const requests = runRequests(settings, traces, ["ecmp", "monkeytree"], true);
    expect(requests.map((r) => [r.index, r.variant, r.load, r.system])).toEqual([
      [0, "a", 0.5, "ecmp"],
      [1, "a", 0.5, "monkeytree"],
      [2, "a", 0.9, "ecmp"],
      [3, "a", 0.9, "monkeytree"],
      [4, "b", 0.5, "ecmp"],
      [5, "b", 0.5, "monkeytree"],
      [6, "b", 0.9, "ecmp"],
      [7, "b", 0.9, "monkeytree"],
    ]);
    expect(drawnFor).toEqual([16, 32]);
    expect(requests.every((r) => r.samples && r.config === config)).toBe(true);
  });

  it("runs a replayed trace once per system", () => {
    const config = presetConfig(PRESETS.small);
    const requests = runRequests([{ name: null, config, hosts: 16 }], () => [{ load: null, jobs: [] }], ["ecmp"], false);
    expect(requests).toEqual([{ index: 0, system: "ecmp", variant: null, load: null, config, jobs: [], samples: false }]);
  });
});
