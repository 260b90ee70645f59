// `vitlens train`'s flags and their help (the README's CLI reference is made from it).
#include <cerrno>
#include <cstdlib>

#include "cli.hpp"
#include "core/data/dataset.hpp"

namespace vitlens::cli {

namespace {

// The optimizer, schedule, regularisation and augmentation.
void add_recipe_flags(CLI::App* cmd, TrainArgs& a) {
  cmd->add_option("--epochs", a.epochs, "Passes over the training images")->check(CLI::Range(1, 10000))->capture_default_str();
  cmd->add_option("--lr", a.lr, "Peak learning rate (AdamW), reached after the warmup, then cosine decay to 1e-5")
      ->capture_default_str();
  cmd->add_option("--weight-decay", a.weight_decay,
                  "AdamW decoupled weight decay, on weight matrices only (not biases, norms, pos_embed, cls_token)")
      ->capture_default_str();
  cmd->add_option("--warmup", a.warmup, "Linear learning-rate warmup, in epochs (fractions allowed)")->capture_default_str();
  cmd->add_option("--seed", a.seed, "Seed for initialisation, data order, augmentation and the held-out split")
      ->check(CLI::Validator(
          [](std::string& text) {
            // Digits only, within 64 bits: the conversion alone turns -1 into 2^64 - 1.
            errno = 0;
            const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
            if (digits) std::strtoull(text.c_str(), nullptr, 10);
            return digits && errno != ERANGE ? std::string()
                                             : "must be a whole number from 0 to 18446744073709551615, got " + text;
          },
          ""))
      ->capture_default_str();
  cmd->add_option("--threads", a.threads, "Worker threads; 0 = one per core (results do not depend on it)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("--shards", a.shards,
                  "Split each batch into N parts whose gradients are summed, weighted by size (gradient "
                  "accumulation). On N to 2N-1 threads, or when N is a multiple of the threads, the parts run side "
                  "by side, one thread each (each thread takes the next part when done with one); otherwise one "
                  "after another on every thread. The numbers depend on N (float rounding only), never on --threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--label-smoothing", a.label_smoothing, "As torch.nn.CrossEntropyLoss(label_smoothing=...)")
      ->capture_default_str();
  cmd->add_option("--drop-path", a.drop_path,
                  "Stochastic depth (timm's drop_path_rate): each training image skips block l's attention and MLP "
                  "branches with probability RATE * l / (depth - 1), the kept ones scaled by 1 / (1 - p); 0 = off")
      ->capture_default_str();
  cmd->add_flag("--augment,!--no-augment", a.augment,
                "Augment the training images (random crop with --crop-pad pixels of zero padding, horizontal flip); "
                "on by default, --no-augment turns it off. With --data photos the flip of the random crops is on unless --no-augment");
  cmd->add_option("--pool", a.pool,
                  "What the classifier head reads: 'cls' (the class token, timm's default) or 'avg' (the mean of "
                  "the patch tokens after the final norm: timm's class_token=False, global_pool='avg', "
                  "fc_norm=False)")
      ->check(CLI::IsMember({"cls", "avg"}))
      ->capture_default_str();
  cmd->add_option("--crop-pad", a.crop_pad, "With --augment: zero padding of the random crop in pixels; 0 = flips only")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
}

// The data split, resume and stop, labels, and MAE's own flags.
void add_data_flags(CLI::App* cmd, TrainArgs& a) {
  cmd->add_option("--val-split", a.val_split,
                  "Share of each class (for photos: of the photos) held out for per-epoch validation (seeded). Default 0.1 "
                  "for a folder or photos; for Fashion-MNIST 0 = evaluate on the 10,000 test images every epoch");
  cmd->add_option("--img-size", a.img_size, "Side images of a --data folder are resized and centre-cropped to; with --data photos, the side of the random crops")
      ->check(CLI::Range(4, 1024))
      ->capture_default_str();
  cmd->add_option("--resume", a.resume,
                  "Continue a run bit for bit from a checkpoint (RUNDIR/last.safetensors and its .state file); give "
                  "the same --data; --epochs may extend the run");
  cmd->add_option("--limit", a.limit, "Use only the first N training (and test) images, for quick tests")
      ->check(CLI::Range(1, 100000000));
  cmd->add_option("--stop-after", a.stop_after, "Stop (and save) after N steps in this invocation; resume later")
      ->check(CLI::Range(1, 100000000));
  cmd->add_option("--grad-dump", a.grad_dump,
                  "Debug: write the gradients of the first batch (file order, no augmentation, no update) as "
                  "safetensors with timm names to FILE, and the initial weights to FILE's .weights.safetensors (both new: a "
                  "name that exists is refused); then exit");
  cmd->add_option("--name", a.name,
                  "The model's name in its config (what 'vitlens info' and the viewer's Model menu show); default: "
                  "vitlens-trained, vitlens-mae with --data photos");
  cmd->add_option("--description", a.description,
                  "The model's description in its config (default: 'ViT trained by vitlens train on DATA', or for "
                  "--data photos 'ViT encoder trained by vitlens train by masked patch prediction (MAE) on the photos "
                  "in DIR')");
  cmd->add_option("--mask-ratio", a.mask_ratio, "photos: share of patches hidden from the encoder, in (0, 1)")
      ->capture_default_str();
  cmd->add_option("--decoder-dim", a.decoder_dim, "photos: width Dd of the MAE decoder")
      ->check(CLI::Range(4, 1024))
      ->capture_default_str();
  cmd->add_option("--decoder-depth", a.decoder_depth, "photos: blocks in the MAE decoder")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--decoder-heads", a.decoder_heads, "photos: attention heads in the MAE decoder (Dd must divide by it)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--crops-per-photo", a.crops_per_photo,
                  "photos: random crops of each training photo per epoch (random scale 0.4-1 of the short side, "
                  "position and flip, resized to --img-size)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
}

}  // namespace

void add_train_command(CLI::App& app, TrainArgs& a) {
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a ViT from scratch: a classifier (Fashion-MNIST or your own ImageFolder tree) or, with --data "
      "photos[:DIR], a masked autoencoder (MAE) on unlabelled photos; checkpoints open in 'vitlens view'");
  cmd->add_option("--data", a.data,
                  "'fashion-mnist' (the IDX files under " + default_fashion_mnist_dir() +
                      "), a folder with one subfolder of images per class (ImageFolder layout), or 'photos:DIR' "
                      "(any folder of images, read recursively; 'photos' alone = " + default_photo_dir() +
                      ") to train by masked patch prediction (MAE, no labels)");
  cmd->add_option("--out,-o", a.out,
                  "Run folder (created if missing): last.safetensors (+ .state.safetensors for --resume), log.jsonl");
  cmd->add_option("--depth", a.depth, "Transformer blocks")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--embed-dim", a.embed_dim, "Token width D")->check(CLI::Range(4, 1024))->capture_default_str();
  cmd->add_option("--heads", a.heads, "Attention heads (D must divide by it)")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--patch", a.patch, "Patch side P in pixels")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--mlp-ratio", a.mlp_ratio, "MLP hidden size = int(D * ratio)")->capture_default_str();
  cmd->add_option("--batch", a.batch, "Images per step (a last partial batch of each epoch is dropped)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  add_recipe_flags(cmd, a);
  add_data_flags(cmd, a);
  cmd->add_flag("--quiet,-q", a.quiet, "Print nothing but errors and the final result");
  a.command = cmd;
}


}  // namespace vitlens::cli
