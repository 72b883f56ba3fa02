# A GPT small enough for CPUs: 4 gloo ranks on 2 cores, ~50-150 ms a step.
# torchrun --nproc-per-node 4 train.py config/tiny.py --data_dir=DIR --max_iters=100
out_dir = "out-tiny"
eval_interval = 100000  # the harness times steps; evaluation would only add a pause
eval_iters = 2
log_interval = 10
always_save_checkpoint = False

dataset = "tiny"
gradient_accumulation_steps = 4  # one micro-step per rank with 4 ranks
batch_size = 16
block_size = 64

n_layer = 2
n_head = 2
n_embd = 64
dropout = 0.0

learning_rate = 1e-3
max_iters = 200
lr_decay_iters = 200
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 10

device = "cpu"
dtype = "float32"
compile = False
backend = "gloo"
