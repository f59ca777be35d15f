import * as fs from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";

// The sweep runs inside `open` between listing the parent and removing what it found; another
// daemon starting at the same moment can remove a stale directory in between. The mock lets a
// test be that other daemon at exactly that point.
const { sweptBeforeUs } = vi.hoisted(() => ({ sweptBeforeUs: new Set<string>() }));
vi.mock("node:fs", async (actual) => {
  const real = await actual<typeof import("node:fs")>();
  return {
    ...real,
    readdirSync: ((path: string, options?: unknown) => {
      if (sweptBeforeUs.delete(path)) real.rmSync(path, { recursive: true });
      return real.readdirSync(path, options as never);
    }) as typeof real.readdirSync,
  };
});

const { ReplacementCgroups } = await import("../../controller/daemon/cgroup.ts");

/** Above Linux's largest pid_max, so no process has it. */
const DEAD_PID = 4_194_305;

const parents: string[] = [];
afterEach(() => {
  sweptBeforeUs.clear();
  for (const parent of parents.splice(0)) fs.rmSync(parent, { recursive: true, force: true });
});

/** A directory shaped like a cgroup v2 one a daemon may write (it only looks for cgroup.procs). */
function cgroupParent(): string {
  const parent = fs.mkdtempSync(join(tmpdir(), "monkeytree-cgroup-"));
  parents.push(parent);
  fs.writeFileSync(join(parent, "cgroup.procs"), "");
  return parent;
}

describe("a daemon's replacement cgroups", () => {
  it("removes what dead daemons left, and keeps a live one's", () => {
    const parent = cgroupParent();
    const stale = join(parent, `monkeytree-${DEAD_PID}-0badcafe`);
    const live = join(parent, `monkeytree-${process.pid}-0000beef`);
    fs.mkdirSync(join(stale, "a1b2c3"), { recursive: true });
    fs.mkdirSync(live);
    const cgroups = ReplacementCgroups.open(parent);
    expect(fs.existsSync(stale)).toBe(false);
    expect(fs.existsSync(live)).toBe(true);
    expect(fs.existsSync(cgroups.dir)).toBe(true);
    cgroups.close();
    expect(fs.existsSync(cgroups.dir)).toBe(false);
  });

  it("starts when a daemon starting beside it swept the same stale directory first", () => {
    const parent = cgroupParent();
    const stale = join(parent, `monkeytree-${DEAD_PID}-0badcafe`);
    fs.mkdirSync(join(stale, "a1b2c3"), { recursive: true });
    sweptBeforeUs.add(stale);
    const cgroups = ReplacementCgroups.open(parent);
    expect(sweptBeforeUs.size).toBe(0);
    expect(fs.readdirSync(parent).filter((name) => name.startsWith("monkeytree-"))).toEqual([cgroups.dir.slice(parent.length + 1)]);
    cgroups.close();
  });
});
