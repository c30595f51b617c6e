#include "common/tokenizer/tiny_tokenizer_corpus.h"

namespace k3 {

std::string_view tiny_tokenizer_corpus() {
  // Written for this project. Changing it changes the tiny vocabulary (and every tiny test that
  // pins token ids), so edit it deliberately.
  static constexpr std::string_view kCorpus = R"corpus(
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran into the forest.
A serving system takes requests from many users at the same time. Each request is a conversation:
the user asks a question, and the assistant writes an answer one token at a time. The router reads
the request, renders the chat template, and turns the text into tokens. Then the prefill node runs
the whole prompt through the model and hands the state to a decode node, which generates the rest.
It's a simple idea, but there are many details. You'll want to keep the memory of every request in
pages, and you'd better free them when the request ends. They're cheap to allocate and we've made
sure that they are reused. I'm sure that the design is right, and I'll show you why in the tests.
Hello world! Hello, World. HELLO WORLD. hello there; how are you today? I am fine, thank you.
The model has layers of attention and of mixture of experts. Attention looks at the tokens that came
before; the experts are small networks, and a router picks the best two of them for every token.
Linear attention keeps a fixed size state, so the cost of a long context grows slowly. The numbers:
1, 2, 3, 10, 20, 30, 100, 256, 512, 1024, 2048, 4096, 65536, 163840, 3.14159, 2.71828, 0.5, 1e-5.
In 2024 and 2025 the models became larger and the context became longer than ever before.

user: What is the capital of France?
assistant: The capital of France is Paris.
user: Write a function that adds two numbers.
assistant: Here is a function that adds two numbers and returns the result.
system: You are a helpful assistant. Answer the question of the user in a short and clear way.
user: Can you explain what a token is?
assistant: A token is a small piece of text, such as a word, a part of a word, or a single byte.

```cpp
#include <vector>
#include <string>

int add(int a, int b) { return a + b; }

struct Request {
  std::string prompt;
  std::vector<int> tokens;
  int max_tokens = 16;
};

for (int i = 0; i < n; ++i) {
  if (tokens[i] == eos) break;
  out.push_back(tokens[i]);
}
return Status::ok();
```

```python
def add(a, b):
    return a + b

class Request:
    def __init__(self, prompt, max_tokens=16):
        self.prompt = prompt
        self.max_tokens = max_tokens

for i in range(10):
    if i % 2 == 0:
        print("even", i)
    else:
        print("odd", i)
```

{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi! How can I help you?"}
{"model": "k3-tiny", "messages": [], "max_tokens": 32, "temperature": 0.7, "stream": true}

你好，世界！我是一个人工智能助手。今天天气很好，我们一起去公园吧。
中文的句子没有空格，所以分词器要把汉字连在一起处理。谢谢你的帮助。
模型的注意力机制和专家混合层一起工作。请问你有什么问题？
The end of the text is here, and the text ends with a new line.
)corpus";
  return kCorpus;
}

}  // namespace k3
