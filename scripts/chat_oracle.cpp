// llama.cpp's own chat code (libllama-common.so) as a command: the oracle the
// toolfmt goldens are recorded from (scripts/record_toolfmt.py builds and runs it).
// stdin: one JSON request per line {template, bos, eos, messages, tools, tool_choice,
//   parallel_tool_calls, reasoning_format, enable_thinking, add_generation_prompt, outputs}
// stdout: one JSON line {prompt, format, grammar, grammar_lazy, triggers, preserved,
//   stops, generation_prompt, parsed: [message or {"error"}]}
#include "chat.h"
#include "common.h"
#include <nlohmann/json.hpp>
#include <iostream>
#include <string>

using nj = nlohmann::ordered_json;

static common_json cj(const nj & v) { return common_json::parse(v.dump()); }
static nj nj_of(const common_json & v) { return nj::parse(v.dump()); }

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        nj out;
        try {
            nj req = nj::parse(line);
            auto tmpls = common_chat_templates_init(nullptr, req.at("template").get<std::string>(),
                                                    req.value("bos", std::string()), req.value("eos", std::string()));
            common_chat_templates_inputs in;
            in.messages = common_chat_msgs_parse_oaicompat(cj(req.at("messages")));
            if (req.contains("tools")) in.tools = common_chat_tools_parse_oaicompat(cj(req["tools"]));
            in.tool_choice = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
            in.parallel_tool_calls = req.value("parallel_tool_calls", false);
            in.add_generation_prompt = req.value("add_generation_prompt", true);
            in.reasoning_format = common_reasoning_format_from_name(req.value("reasoning_format", std::string("none")));
            in.enable_thinking = req.value("enable_thinking", true);
            auto p = common_chat_templates_apply(tmpls.get(), in);
            out["prompt"] = p.prompt;
            out["format"] = common_chat_format_name(p.format);
            out["grammar"] = p.grammar;
            out["grammar_lazy"] = p.grammar_lazy;
            nj trig = nj::array();
            for (auto & t : p.grammar_triggers) trig.push_back({{"type", (int) t.type}, {"value", t.value}});
            out["triggers"] = trig;
            out["preserved"] = p.preserved_tokens;
            out["stops"] = p.additional_stops;
            out["generation_prompt"] = p.generation_prompt;
            common_chat_parser_params pp(p);
            pp.reasoning_format = in.reasoning_format;
            if (!p.parser.empty()) pp.parser.load(p.parser);
            nj parsed = nj::array();
            for (auto & o : req.value("outputs", nj::array())) {
                try {
                    auto msg = common_chat_parse(o.get<std::string>(), req.value("partial", false), pp);
                    parsed.push_back(nj_of(msg.to_json_oaicompat()));
                } catch (const std::exception & e) {
                    parsed.push_back({{"error", e.what()}});
                }
            }
            out["parsed"] = parsed;
        } catch (const std::exception & e) {
            out = {{"error", e.what()}};
        }
        std::cout << out.dump() << std::endl;
    }
}
