"""What the CUDA tests share."""

# a hand-written PTX kernel: out[tid] = in[tid] + 1 for one block, with one trailing parameter plugrad does not pass
ADD1_PTX = """// plugrad.shared_bytes = 1024
.version 8.0
.target sm_80
.address_size 64
.visible .entry add1(
	.param .u64 .ptr .global .align 1 add1_param_0,
	.param .u64 add1_param_1,
	.param .u32 add1_param_2,
	.param .u64 .ptr .global .align 1 add1_param_3
)
{
	.reg .b32 %r<3>;
	.reg .f32 %f<3>;
	.reg .b64 %rd<6>;
	ld.param.u64 %rd1, [add1_param_0];
	ld.param.u64 %rd2, [add1_param_1];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd3, %r1, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.f32 %f1, [%rd4];
	add.f32 %f2, %f1, 0f3F800000;
	add.s64 %rd5, %rd1, %rd3;
	st.global.f32 [%rd5], %f2;
	ret;
}
"""
