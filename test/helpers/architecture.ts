// The import direction between MonkeyTree's folders, as one table, and the checker that holds
// the code to it (test/architecture.test.ts). docs/architecture.md mirrors it.
import { posix } from "node:path";
import ts from "typescript";

/** The layers, bottom to top: each imports only itself and the layers below it. */
export const LAYERS = ["native", "sdk", "controller", "cli"] as const;

/**
 * The finer order inside a layer, bottom to top: a unit imports its own files and the units of
 * lower tiers, never those of its own tier or above. A file no unit names (a new entry point,
 * say) sits above every tier of its layer, so nothing below may import it.
 */
export const TIERS: Readonly<Record<string, readonly (readonly string[])[]>> = {
  sdk: [
    // The Python hook imports no TypeScript; the launcher points torchrun at it.
    ["sdk/contract/errors.ts", "sdk/contract/log.ts", "sdk/contract/paths.ts", "sdk/python/"],
    ["sdk/contract/protocol/", "sdk/contract/checkpoint/"],
    ["sdk/client/connection.ts", "sdk/client/hold.ts"],
    ["sdk/client/client.ts"],
    ["sdk/client/agent.ts"],
    ["sdk/client/migrate.ts", "sdk/client/launch/"],
  ],
  controller: [
    ["controller/planner/model/"],
    ["controller/planner/plan/", "controller/planner/route/", "controller/metrics/", "controller/schedulers/slurm/"],
    // The simulator runs the planner and routing in the loop, exactly as the service does.
    ["controller/simulator/"],
    ["controller/service/", "controller/daemon/"],
  ],
};

/**
 * Folders outside the layers, and the folders their relative imports may reach. Examples
 * import MonkeyTree by its package name (`monkeytree`, `monkeytree/…`), as a user would; only
 * tests may reach into examples/ and test/.
 */
export const OUTSIDE: Readonly<Record<string, readonly string[]>> = {
  bin: ["bin", ...LAYERS],
  bench: ["bench", ...LAYERS],
  examples: ["examples"],
  test: ["test", "examples", "bench", "bin", ...LAYERS],
};

/** The folders whose code is checked. */
export const CHECKED = [...LAYERS, ...Object.keys(OUTSIDE)];

export interface Violation {
  readonly file: string;
  readonly line: number;
  /** As written in the source. */
  readonly specifier: string;
  /** Repository-relative. */
  readonly target: string;
  readonly rule: string;
}

const folderOf = (path: string): string | undefined => CHECKED.find((folder) => path === folder || path.startsWith(`${folder}/`));

/** The unit of `path` inside its layer and that unit's tier; entry points get the tier above all. */
function unitOf(layer: string, path: string): { unit: string; tier: number } {
  const tiers = TIERS[layer] ?? [];
  for (const [tier, units] of tiers.entries()) {
    const unit = units.find((u) => (u.endsWith("/") ? path.startsWith(u) : path === u));
    if (unit) return { unit, tier };
  }
  return { unit: path, tier: tiers.length };
}

/** Why `file` may not import `target` (both repository-relative), or null when it may. */
export function ruleBroken(file: string, target: string): string | null {
  const from = folderOf(file);
  const to = folderOf(target);
  // The repository root (package.json, the package itself) and other folders are no layer.
  if (from === undefined || to === undefined) return null;
  const layerIndex = (LAYERS as readonly string[]).indexOf(from);
  const allowed = layerIndex >= 0 ? LAYERS.slice(0, layerIndex + 1).reverse() : (OUTSIDE[from] ?? []);
  if (!allowed.includes(to)) {
    const how = from === "examples" ? "; import MonkeyTree by its package name (monkeytree, monkeytree/…)" : "";
    return `${from}/ may import only ${allowed.map((f) => `${f}/`).join(", ")}${how} (layers, bottom to top: ${LAYERS.join(" ← ")})`;
  }
  if (from !== to || !TIERS[from]) return null;
  const source = unitOf(from, file);
  const dest = unitOf(from, target);
  if (source.unit === dest.unit || dest.tier < source.tier) return null;
  const below = (TIERS[from] ?? []).slice(0, source.tier).flat();
  return `inside ${from}/, ${source.unit} may import only ${below.length ? below.join(", ") : "nothing of its layer"} besides itself (see TIERS in test/helpers/architecture.ts)`;
}

/** The specifiers of `source` that name a file: imports, re-exports, import(), require() and new URL(…, import.meta.url). */
function specifiers(file: string, source: string): { specifier: string; line: number; url: boolean }[] {
  const sf = ts.createSourceFile(file, source, ts.ScriptTarget.Latest, true, file.endsWith(".ts") ? ts.ScriptKind.TS : ts.ScriptKind.JS);
  const found: { specifier: string; line: number; url: boolean }[] = [];
  const add = (node: ts.Node | undefined, url = false) => {
    if (node && ts.isStringLiteralLike(node)) found.push({ specifier: node.text, line: sf.getLineAndCharacterOfPosition(node.getStart()).line + 1, url });
  };
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) add(node.moduleSpecifier);
    else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) add(node.argument.literal);
    else if (
      ts.isCallExpression(node) &&
      (node.expression.kind === ts.SyntaxKind.ImportKeyword || (ts.isIdentifier(node.expression) && node.expression.text === "require"))
    ) {
      add(node.arguments[0]);
    } else if (ts.isNewExpression(node) && ts.isIdentifier(node.expression) && node.expression.text === "URL") {
      const base = node.arguments?.[1];
      if (base && base.getText(sf) === "import.meta.url") add(node.arguments?.[0], true);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return found;
}

/** Every import in `source` (the text of repository-relative `file`) that breaks a rule. */
export function checkImports(file: string, source: string): Violation[] {
  const violations: Violation[] = [];
  for (const { specifier, line, url } of specifiers(file, source)) {
    // A URL resolves any string without a scheme against the module; an import only ./ and ../.
    const relative = url ? !/^[a-z][a-z0-9+.-]*:/i.test(specifier) && !specifier.startsWith("/") : specifier.startsWith(".");
    if (!relative) continue;
    const target = posix.normalize(posix.join(posix.dirname(file), specifier));
    const rule = ruleBroken(file, target);
    if (rule) violations.push({ file, line, specifier, target, rule });
  }
  return violations;
}
