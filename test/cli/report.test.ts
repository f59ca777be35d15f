import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { SimulationReportSchema, type SimulationReport } from "../../controller/simulator/index.ts";
import { runCli } from "../helpers/cli.ts";
import { canRun, chromium } from "../helpers/prerequisites.ts";

const dir = mkdtempSync(join(tmpdir(), "monkeytree-report-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A fig-* preset, reduced to a few jobs and what `args` pick: its JSON report and its page. */
async function reported(name: string, ...args: string[]): Promise<{ report: SimulationReport; page: string; path: string }> {
  const out = join(dir, name);
  const result = await runCli("simulate", ...args, "--report", out, "--json");
  expect(result.stderr).not.toMatch(/error/i);
  expect(result.code).toBe(0);
  const path = join(out, "index.html");
  return { report: SimulationReportSchema.parse(JSON.parse(result.stdout)), page: readFileSync(path, "utf8"), path };
}

/** The page's headline table: number → [paper, ours]. */
const headlines = (page: string): Map<string, [string, string]> => {
  const table = page.split("<h2>The paper's numbers beside ours</h2>")[1]?.split("</table>")[0] ?? "";
  const rows = [...table.matchAll(/<tr><td>[^<]*<\/td><td>([^<]*)<\/td><td>([^<]*)<\/td><td>([^<]*)<\/td>/g)];
  return new Map(rows.map(([, label, paper, ours]) => [label!.replace(/&amp;/g, "&"), [paper!, ours!]]));
};

const run = (report: SimulationReport, system: string, load: number, variant: string | null = null) =>
  report.systems.find((s) => s.name === system && s.load === load && s.variant === variant)!;

/** The counts the page's own check leaves on <body> once chromium has laid it out. */
function drawnInChromium(path: string): { figures: number; drawn: number } {
  const dump = spawnSync("chromium", ["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", `file://${path}`], { encoding: "utf8", timeout: 60_000 });
  const body = /<body data-figures="(\d+)" data-drawn="(\d+)">/.exec(dump.stdout);
  if (!body) return expect.fail(`chromium's DOM has no counts on <body>: ${dump.stdout.slice(0, 300)} ${dump.stderr.slice(-300)}`);
  return { figures: Number(body[1]), drawn: Number(body[2]) };
}

describe("monkeytree simulate --report", () => {
  let slowdown: Awaited<ReturnType<typeof reported>>;
  let threshold: Awaited<ReturnType<typeof reported>>;

  it("writes one page with the paper's headline numbers beside the run's own, a figure per chart and every run", async () => {
    slowdown = await reported("slowdown", "--preset", "fig-slowdown", "--jobs", "100", "--loads", "0.9,1");
    const rows = headlines(slowdown.page);
    const mt = run(slowdown.report, "monkeytree", 1).slowdown.p99;
    expect(rows.get("MonkeyTree p99, 100% load")).toEqual(["1.044", mt.toFixed(3)]);
    expect(rows.get("ECMP p99 ÷ MonkeyTree's, 100%")).toEqual(["3.59", (run(slowdown.report, "ecmp", 1).slowdown.p99 / mt).toFixed(2)]);
    // p99 and average slowdown against load; the busiest rack's and the total fragmentation per load.
    expect(slowdown.page.match(/<figure>/g)?.length).toBeGreaterThanOrEqual(2 + 2 * 2);
    for (const system of ["ecmp", "crux", "sglb", "perfect", "monkeytree", "monkeytree-ecmp", "monkeytree-crux", "monkeytree-sglb", "spray"]) {
      expect(slowdown.page).toContain(`<td>${system}</td>`);
    }
  });

  it("charts a one-load preset against its variants, and says which of the paper's numbers the run left out", async () => {
    threshold = await reported("threshold", "--preset", "fig-threshold", "--jobs", "60", "--variants", "lambda-2,lambda-4");
    const rows = headlines(threshold.page);
    expect(rows.get("p99 at λ = 4")).toEqual(["1.060", run(threshold.report, "monkeytree", 1, "lambda-4").slowdown.p99.toFixed(3)]);
    expect(rows.get("migrations at λ = 2")).toEqual(["266", String(run(threshold.report, "monkeytree", 1, "lambda-2").migrations)]);
    expect(rows.get("p99 at λ = 8")).toEqual(["1.831", "not run"]);
    expect(threshold.page).toContain("p99 job slowdown at 100% load");
    expect(threshold.page).toMatch(/>lambda-2<\/text>/);
  });

  it("merges a sweep's parts into the run they split, and seeds into the paper's numbers' mean and range", async () => {
    const part = async (name: string, ...args: string[]) => {
      const result = await runCli("simulate", "--preset", "fig-threshold", "--jobs", "60", ...args, "--json");
      expect(result.code).toBe(0);
      writeFileSync(join(dir, name), result.stdout);
      return join(dir, name);
    };
    const [low, high, seed2] = await Promise.all([
      part("low.json", "--variants", "lambda-2"),
      part("high.json", "--variants", "lambda-4"),
      part("seed2.json", "--variants", "lambda-2,lambda-4", "--seed", "2"),
    ]);
    const whole = join(dir, "whole.json");
    writeFileSync(whole, JSON.stringify(threshold.report));
    const merged = await runCli("simulate", "--merge", [low, high].join(","), "--json");
    expect(merged.code).toBe(0);
    const [one, ...none] = (JSON.parse(merged.stdout) as unknown[]).map((r) => SimulationReportSchema.parse(r));
    expect(none).toEqual([]);
    const withoutTimes = (r: SimulationReport) => r.systems.map(({ solver: _, ...rest }) => rest);
    expect(withoutTimes(one!)).toEqual(withoutTimes(threshold.report));
    expect(one!.variants.map((v) => v.name)).toEqual(["lambda-2", "lambda-4"]);

    const out = join(dir, "seeds");
    const seeds = await runCli("simulate", "--merge", [whole, seed2].join(","), "--report", out);
    expect(seeds.code).toBe(0);
    const page = readFileSync(join(out, "index.html"), "utf8");
    const second = SimulationReportSchema.parse(JSON.parse(readFileSync(seed2, "utf8")));
    const p99s = [threshold.report, second].map((r) => run(r, "monkeytree", 1, "lambda-4").slowdown.p99);
    const [lo, hi] = [Math.min(...p99s), Math.max(...p99s)].map((v) => v.toFixed(3));
    expect(headlines(page).get("p99 at λ = 4")).toEqual(["1.060", `${((p99s[0]! + p99s[1]!) / 2).toFixed(3)} (${lo}–${hi})`]);
    // The text output ends with the same numbers.
    expect(seeds.stdout).toContain("the paper's numbers beside ours");
    const cell = `${((p99s[0]! + p99s[1]!) / 2).toFixed(3)} (${lo}–${hi})`.replace(/[.()]/g, "\\$&");
    expect(seeds.stdout).toMatch(new RegExp(`p99 at λ = 4 +1\\.060 +${cell} `));
    expect(page).toContain("ours: mean (range) over 2 seeds");
    expect(page.match(/<tr><td>2<\/td><td>lambda-/g)).toHaveLength(2);
  });

  it.each([
    [["--merge", "SELF,SELF"], /report \S+whole.json at systems: repeats monkeytree at load 1, variant lambda-2 of seed 1, which \S+whole.json holds/],
    [["--merge", "SELF,OTHER"], /report \S+slowdown.json at preset: is "fig-slowdown", where \S+whole.json has "fig-threshold": merge one preset's runs/],
    [["--merge", "SELF", "--seed", "3"], /--seed: --merge reads runs already made; give only --report, --plot or --json with it/],
    [["--merge", "NONE"], /report \S+none.json: cannot read it/],
  ])("refuses %j with exit code 2, naming the file and what to fix", async (args, message) => {
    writeFileSync(join(dir, "slowdown.json"), JSON.stringify(slowdown.report));
    const paths = { SELF: join(dir, "whole.json"), OTHER: join(dir, "slowdown.json"), NONE: join(dir, "none.json") };
    const result = await runCli("simulate", ...args.map((a) => a.replace(/SELF|OTHER|NONE/g, (k) => paths[k as keyof typeof paths])));
    expect(result.stderr).toMatch(message);
    expect(result.code).toBe(2);
  });

  it.skipIf(!canRun("the report's page in a browser", chromium()))(
    "draws every figure in headless chromium, and the page's check finds a figure without marks undrawn",
    () => {
      for (const { path, page } of [slowdown, threshold]) {
        const counts = drawnInChromium(path);
        expect(counts.figures).toBe(page.match(/<figure>/g)?.length);
        expect(counts.drawn).toBe(counts.figures);
      }
      const unmarked = join(dir, "unmarked.html");
      writeFileSync(unmarked, slowdown.page.replaceAll('class="mark"', ""));
      expect(drawnInChromium(unmarked)).toMatchObject({ drawn: 0 });
    },
  );
});
