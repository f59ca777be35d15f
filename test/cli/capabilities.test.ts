import { describe, expect, it } from "vitest";
import { capabilities } from "../../native/index.ts";
import { runCli } from "../helpers/cli.ts";

describe("monkeytree capabilities", () => {
  it("prints the host's probe, with a reason for every absent part", async () => {
    const { code, stdout } = await runCli("capabilities");
    expect(code).toBe(0);
    expect(stdout).toMatch(/^tcp\s+yes$/m);
    for (const name of ["rdma", "cuda", "gpudirect"]) expect(stdout).toMatch(new RegExp(`^${name}\\s+(yes \\(\\d+ devices?\\)|no: \\S.*)`, "m"));
  });

  it("prints the same probe as JSON", async () => {
    const { code, stdout } = await runCli("capabilities", "--json");
    expect(code).toBe(0);
    expect(JSON.parse(stdout)).toEqual(capabilities());
  });
});
