/* lib/train/nn_internal.h - what the nn files share: the autocast casts
 * (definitions in nn_layers.c). */
#ifndef FG_LIB_NN_INTERNAL_H
#define FG_LIB_NN_INTERNAL_H

#include "flashgrad/tensor.h"

/* x in the autocast dtype when a region is active and x is a CUDA tensor
 * of another dtype (a recorded cast, so its gradient returns in x's
 * dtype); otherwise a new reference to x. NULL stays NULL. */
fg_status fg_nn_ac_cast(fg_tensor *x, fg_tensor **y);
/* x cast to dt if its dtype differs (recorded), else a new reference. */
fg_status fg_nn_to_dtype(fg_tensor *x, fg_dtype dt, fg_tensor **y);

#endif /* FG_LIB_NN_INTERNAL_H */
