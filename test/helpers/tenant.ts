import { chownSync, mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Tenant } from "../../controller/daemon/replacements.ts";
import { replacementUser } from "../../cli/demo/processes.ts";

/** Who the tests' daemons run replacements as: nobody when the tests run as root, else the tests' user. */
export const TENANT: Tenant | undefined = replacementUser();

/** A fresh directory the tests' replacements can write in. */
export function tenantDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-tenant-"));
  if (TENANT) chownSync(dir, TENANT.uid, TENANT.gid);
  return dir;
}

/**
 * SIGKILLs the replacements that daemons started for the controller at `endpoint`, found by the
 * MONKEYTREE_CONTROLLER their environment carries: they run in process groups of their own and
 * outlive their daemons, as they must on a real host, so a test's teardown ends them itself.
 */
export function killReplacements(endpoint: string): void {
  const marker = `MONKEYTREE_CONTROLLER=${endpoint}\0`;
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    let environ: string;
    try {
      environ = readFileSync(`/proc/${pid}/environ`, "latin1");
    } catch {
      continue; // gone, or not ours to read
    }
    if (!`${environ}\0`.includes(marker)) continue;
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {
      // Already gone.
    }
  }
}
