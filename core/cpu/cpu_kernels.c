/* The CPU kernel table: one entry per op; NONE and VIEW compute nothing. */
#include "cpu_ops.h"

const struct tsr_cpu_kernel tsr_cpu_kernels[TSR_OP_COUNT] = {
    [TSR_OP_GET_ROWS] = {tsr_cpu_get_rows, NULL, tsr_cpu_get_rows_check},
    [TSR_OP_MAT_MUL] = {tsr_cpu_mat_mul, tsr_cpu_mat_mul_work, tsr_cpu_mat_mul_check,
                        tsr_cpu_mat_mul_shared},
    [TSR_OP_MAT_MUL_ID] = {tsr_cpu_mat_mul_id, tsr_cpu_mat_mul_id_work, tsr_cpu_mat_mul_check},
    [TSR_OP_ADD] = {tsr_cpu_add, NULL, NULL},
    [TSR_OP_MUL] = {tsr_cpu_mul, NULL, NULL},
    [TSR_OP_SCALE] = {tsr_cpu_scale, NULL, NULL},
    [TSR_OP_RMS_NORM] = {tsr_cpu_rms_norm, NULL, NULL},
    [TSR_OP_L2_NORM] = {tsr_cpu_l2_norm, NULL, NULL},
    [TSR_OP_ROPE] = {tsr_cpu_rope, NULL, NULL},
    [TSR_OP_SOFTMAX] = {tsr_cpu_softmax, NULL, NULL},
    [TSR_OP_UNARY] = {tsr_cpu_unary, NULL, NULL},
    [TSR_OP_GLU] = {tsr_cpu_glu, NULL, NULL},
    [TSR_OP_SOFTCAP] = {tsr_cpu_softcap, NULL, NULL},
    [TSR_OP_CONCAT] = {tsr_cpu_concat, NULL, NULL},
    [TSR_OP_CPY] = {tsr_cpu_cpy, tsr_cpu_cpy_work, tsr_cpu_cpy_check},
    [TSR_OP_SET_ROWS] = {tsr_cpu_set_rows, tsr_cpu_set_rows_work, tsr_cpu_set_rows_check},
    [TSR_OP_TOP_K] = {tsr_cpu_top_k, tsr_cpu_top_k_work, NULL},
    [TSR_OP_ARGMAX] = {tsr_cpu_argmax, NULL, NULL},
    [TSR_OP_FLASH_ATTN] = {tsr_cpu_flash_attn, tsr_cpu_flash_attn_work, NULL},
    [TSR_OP_CUSTOM] = {tsr_cpu_custom, NULL, tsr_cpu_custom_check},
};
