import { spawnSync, type SpawnSyncReturns } from "node:child_process";
import { fileURLToPath } from "node:url";

/**
 * Runs `body` (statements of an ES module) in a Node child under tsx, killed past `timeoutMs`
 * with its `signal` set: a synchronous call that would spin or block forever fails its test
 * instead of stopping the whole run. `imports` are the sources it needs, repository-relative,
 * bound to their names: `{ Journal: "controller/service/journal.ts" }`.
 */
export function runIsolated(imports: Record<string, string>, body: string, timeoutMs = 30_000): SpawnSyncReturns<string> {
  const lines = Object.entries(imports).map(
    ([name, path]) => `import { ${name} } from ${JSON.stringify(fileURLToPath(new URL(`../../${path}`, import.meta.url)))};`,
  );
  return spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", [...lines, body].join("\n")], { encoding: "utf8", timeout: timeoutMs });
}
