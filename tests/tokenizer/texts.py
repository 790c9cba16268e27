"""Text that exercises a tokenizer: accents, CJK, emoji, code whitespace, numbers, special tokens."""

VARIED_TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "Crème brûlée, naïve façade, Ångström, São Paulo, Dvořák",
    "日本語のテキストと中文字符，한국어 텍스트",
    "emoji 🎉👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷 and ✨",
    "def f(x):\n    return  x   +1\n\n\n\t\tif  y:\n        pass    \n",
    "3.14159 12345 1,000,000 -42 0x1F 2024-06-01",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <file_sep> too",
    "   leading and trailing spaces   ",
    "line\r\nwindows\rold mac\n",
    "",
    "a",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "Ünïcödé 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
]
