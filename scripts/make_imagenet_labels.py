#!/usr/bin/env python3
# Writes assets/labels/imagenet-1k.txt: ImageNet-1k's 1000 class names, one a line, in the
# standard class-index order (the sorted WordNet synset ids of the ILSVRC-2012 classes), each the
# synset's WordNet lemmas as timm's ImageNetInfo describes them ("tench, Tinca tinca").
# How it was run (the project's venv, timm 1.0.31):
#   /work/venv/bin/python scripts/make_imagenet_labels.py
import os

from timm.data import ImageNetInfo

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "assets", "labels", "imagenet-1k.txt")


def main():
    info = ImageNetInfo("imagenet-1k")
    names = [info.index_to_description(i) for i in range(info.num_classes())]
    assert len(names) == 1000 and all(names) and not any("\n" in n for n in names)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(names) + "\n")
    print(f"{len(names)} names -> {os.path.normpath(OUT)} (first {names[0]!r}, last {names[-1]!r})")


if __name__ == "__main__":
    main()
