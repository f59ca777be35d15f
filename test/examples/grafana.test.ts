import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { DaemonMetrics } from "../../controller/daemon/metrics.ts";
import { ControllerMetrics } from "../../controller/service/metrics.ts";

/** The Grafana dashboard in examples/ must chart only metrics the controller and daemons export. */

interface Panel {
  readonly title: string;
  readonly targets?: readonly { readonly expr: string }[];
}

const dashboard = JSON.parse(readFileSync(new URL("../../examples/grafana/monkeytree.json", import.meta.url), "utf8")) as { title: string; panels: Panel[] };

/** Every series name a scrape can return: counters and gauges as named, histograms' _bucket, _sum and _count. */
async function exported(): Promise<Set<string>> {
  const names = new Set<string>();
  for (const registry of [new ControllerMetrics().registry, new DaemonMetrics().registry]) {
    for (const metric of await registry.getMetricsAsJSON()) {
      if (String(metric.type) === "histogram") for (const suffix of ["_bucket", "_sum", "_count"]) names.add(`${metric.name}${suffix}`);
      else names.add(metric.name);
    }
  }
  return names;
}

describe("examples/grafana/monkeytree.json", () => {
  it("queries only metric names the controller and daemons export, and charts each of them", async () => {
    const names = await exported();
    const used = new Set<string>();
    expect(dashboard.panels.length).toBeGreaterThan(0);
    for (const panel of dashboard.panels) {
      expect(panel.targets?.length, panel.title).toBeGreaterThan(0);
      for (const target of panel.targets ?? []) {
        const found = target.expr.match(/\bmonkeytree_[a-z_]+/g) ?? [];
        expect(found.length, `${panel.title}: ${target.expr}`).toBeGreaterThan(0);
        for (const name of found) {
          expect(names.has(name), `${panel.title} uses ${name}, which nothing exports`).toBe(true);
          used.add(name.replace(/_(bucket|sum|count)$/, ""));
        }
      }
    }
    // The other way round: a metric no panel shows is one the dashboard forgot.
    const families = new Set([...names].map((n) => n.replace(/_(bucket|sum|count)$/, "")));
    const unused = [...families].filter((name) => !used.has(name));
    expect(unused).toEqual([]);
  });
});
