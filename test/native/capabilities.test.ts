import { describe, expect, it } from "vitest";
import { capabilities } from "../../native/index.ts";

describe("capabilities", () => {
  it("always offers TCP and explains every absent accelerator", () => {
    const caps = capabilities();
    expect(caps.tcp.present).toBe(true);
    for (const part of [caps.rdma, caps.cuda, caps.gpudirect]) {
      if (part.present) expect(part.devices.length).toBeGreaterThan(0);
      else expect(part.reason).toMatch(/\S/);
    }
  });

  it("gives GPUDirect only with both CUDA and RDMA devices", () => {
    const caps = capabilities();
    if (!caps.cuda.present || !caps.rdma.present) expect(caps.gpudirect.present).toBe(false);
  });
});
