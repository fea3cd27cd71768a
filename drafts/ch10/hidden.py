# Chapter 10's hidden cells: the lead wrote and pasted them already (drafts/ch10/hidden_lead.py, in the
# source since 4e96a5b). H2's one change for the source: the kernel-only rule (autograder c842684).
#
# ==== replace in the first hidden cell (course/10_attention_kernels.py, the line `hidden = HiddenTests(REFERENCE)`)
# %% [hidden]
KERNEL_ONLY = {"softmax", "online_softmax_states", "flash_attention_forward", "flash_attention_backward",
               "flash_attention", "flash_decoding_partials", "combine_partials", "paged_decoding"}
hidden = HiddenTests(REFERENCE, kernel_only=KERNEL_ONLY)
