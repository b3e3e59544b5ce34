// out[i] = a[i] + b[i] (float32) for RDNA3 (gfx1100, wave32), written by hand in AMDGPU assembly.
// Assemble and link (what plugins/amd/examples/byo_assembly.py does):
//   clang -x assembler -target amdgcn-amd-amdhsa -mcpu=gfx1100 -c rdna3_vadd.s -o vadd.o && ld.lld -shared vadd.o -o vadd.hsaco
// The plugrad AMD kernel ABI: one 64-bit pointer per buffer in order (out, a, b) in the kernarg segment; launched with
// local_size (64, 1, 1) and global_size (n / 64, 1, 1) workgroups, so i = workgroup_id.x * 64 + workitem_id.x.
// Registers at entry (.amdhsa_* below): s[0:1] the kernarg segment pointer, s2 the workgroup id x; v0 the work-item
// ids, packed on gfx11 (x in bits 9:0).

  .amdgcn_target "amdgcn-amd-amdhsa--gfx1100"
  .text
  .globl vadd
  .p2align 8
  .type vadd,@function
vadd:
  s_load_b128 s[4:7], s[0:1], 0x0         // s[4:5] = out, s[6:7] = a
  s_load_b64 s[8:9], s[0:1], 0x10         // s[8:9] = b
  v_and_b32 v0, 0x3ff, v0                 // workitem id x
  s_lshl_b32 s2, s2, 6                    // workgroup id x * 64
  v_add_nc_u32 v0, s2, v0                 // i
  v_lshlrev_b32 v0, 2, v0                 // byte offset of element i
  s_waitcnt lgkmcnt(0)
  global_load_b32 v1, v0, s[6:7]          // a[i]
  global_load_b32 v2, v0, s[8:9]          // b[i]
  s_waitcnt vmcnt(0)
  v_add_f32 v1, v1, v2
  global_store_b32 v0, v1, s[4:5]         // out[i]
  s_endpgm
.Lvadd_end:
  .size vadd, .Lvadd_end-vadd

  .rodata
  .p2align 6
  .amdhsa_kernel vadd
    .amdhsa_user_sgpr_kernarg_segment_ptr 1
    .amdhsa_system_sgpr_workgroup_id_x 1
    .amdhsa_system_vgpr_workitem_id 0
    .amdhsa_kernarg_size 24
    .amdhsa_next_free_vgpr 3
    .amdhsa_next_free_sgpr 10
    .amdhsa_wavefront_size32 1
  .end_amdhsa_kernel

  .amdgpu_metadata
---
amdhsa.version: [ 1, 2 ]
amdhsa.target: amdgcn-amd-amdhsa--gfx1100
amdhsa.kernels:
  - .name: vadd
    .symbol: vadd.kd
    .kernarg_segment_size: 24
    .kernarg_segment_align: 8
    .group_segment_fixed_size: 0
    .private_segment_fixed_size: 0
    .wavefront_size: 32
    .sgpr_count: 10
    .vgpr_count: 3
    .max_flat_workgroup_size: 64
    .args:
      - { .name: out, .offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global }
      - { .name: a, .offset: 8, .size: 8, .value_kind: global_buffer, .address_space: global }
      - { .name: b, .offset: 16, .size: 8, .value_kind: global_buffer, .address_space: global }
...
  .end_amdgpu_metadata
