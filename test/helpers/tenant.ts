import { chownSync, mkdtempSync } from "node:fs";
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
