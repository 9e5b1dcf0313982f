/* tokenizer.c: tokenizers built from GGUF metadata (tokenizer.ggml.*).
 *
 *   - "llama" (SentencePiece style, DHSA_TOKENIZER_SPM): spaces become
 *     U+2581 '▁', a '▁' is prepended when add_space_prefix, then adjacent
 *     symbols (UTF-8 characters at first) are merged greedily, always the
 *     pair whose concatenation is a vocab token of the highest score
 *     (ties: leftmost); a final symbol that is not a token becomes its
 *     bytes' <0xXX> tokens (or unk).
 *   - "gpt2" (byte-level BPE, DHSA_TOKENIZER_BPE): the text is split into
 *     words by the pre-tokenizer named by tokenizer.ggml.pre (hand-written
 *     matchers of the published regexes, run as a list where llama.cpp
 *     has several; Unicode letter/number/punctuation tables below), each
 *     word's bytes are mapped to printable code points (the
 *     GPT-2 byte-to-unicode table), and adjacent symbols are merged by the
 *     lowest merge rank (ties: leftmost).
 *   - Both: USER_DEFINED tokens (and CONTROL tokens with
 *     DHSA_TOKENIZE_PARSE_SPECIAL) are cut out of the text first, longest
 *     match at the leftmost position.
 *
 * Contract: the API is the "Tokenizer" block of include/dhsa.h; errors are
 * values with a sentence, never an abort; sizes are checked before they
 * are allocated. Tests: tests/test_tokenizer.c (every vector of
 * ../shared/vocab, round trips, malformed input); docs/tokenizer.md.
 */
#include "model/tokenizer.h"
#include "core/internal.h"
#include "core/procmem.h"
#include "dhsa.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------- */
/* Unicode tables (generated from Python's unicodedata, Unicode 14.0)      */

/* General_Category L* (letters): 648 ranges [lo, hi] of code points, sorted. */
static const uint32_t uni_letter[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6},
    {0xD8, 0xF6}, {0xF8, 0x2C1}, {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE},
    {0x370, 0x374}, {0x376, 0x377}, {0x37A, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A},
    {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x559, 0x559}, {0x560, 0x588}, {0x5D0, 0x5EA}, {0x5EF, 0x5F2}, {0x620, 0x64A}, {0x66E, 0x66F},
    {0x671, 0x6D3}, {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF},
    {0x710, 0x710}, {0x712, 0x72F}, {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7CA, 0x7EA}, {0x7F4, 0x7F5},
    {0x7FA, 0x7FA}, {0x800, 0x815}, {0x81A, 0x81A}, {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858},
    {0x860, 0x86A}, {0x870, 0x887}, {0x889, 0x88E}, {0x8A0, 0x8C9}, {0x904, 0x939}, {0x93D, 0x93D},
    {0x950, 0x950}, {0x958, 0x961}, {0x971, 0x980}, {0x985, 0x98C}, {0x98F, 0x990}, {0x993, 0x9A8},
    {0x9AA, 0x9B0}, {0x9B2, 0x9B2}, {0x9B6, 0x9B9}, {0x9BD, 0x9BD}, {0x9CE, 0x9CE}, {0x9DC, 0x9DD},
    {0x9DF, 0x9E1}, {0x9F0, 0x9F1}, {0x9FC, 0x9FC}, {0xA05, 0xA0A}, {0xA0F, 0xA10}, {0xA13, 0xA28},
    {0xA2A, 0xA30}, {0xA32, 0xA33}, {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA59, 0xA5C}, {0xA5E, 0xA5E},
    {0xA72, 0xA74}, {0xA85, 0xA8D}, {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0}, {0xAB2, 0xAB3},
    {0xAB5, 0xAB9}, {0xABD, 0xABD}, {0xAD0, 0xAD0}, {0xAE0, 0xAE1}, {0xAF9, 0xAF9}, {0xB05, 0xB0C},
    {0xB0F, 0xB10}, {0xB13, 0xB28}, {0xB2A, 0xB30}, {0xB32, 0xB33}, {0xB35, 0xB39}, {0xB3D, 0xB3D},
    {0xB5C, 0xB5D}, {0xB5F, 0xB61}, {0xB71, 0xB71}, {0xB83, 0xB83}, {0xB85, 0xB8A}, {0xB8E, 0xB90},
    {0xB92, 0xB95}, {0xB99, 0xB9A}, {0xB9C, 0xB9C}, {0xB9E, 0xB9F}, {0xBA3, 0xBA4}, {0xBA8, 0xBAA},
    {0xBAE, 0xBB9}, {0xBD0, 0xBD0}, {0xC05, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28}, {0xC2A, 0xC39},
    {0xC3D, 0xC3D}, {0xC58, 0xC5A}, {0xC5D, 0xC5D}, {0xC60, 0xC61}, {0xC80, 0xC80}, {0xC85, 0xC8C},
    {0xC8E, 0xC90}, {0xC92, 0xCA8}, {0xCAA, 0xCB3}, {0xCB5, 0xCB9}, {0xCBD, 0xCBD}, {0xCDD, 0xCDE},
    {0xCE0, 0xCE1}, {0xCF1, 0xCF2}, {0xD04, 0xD0C}, {0xD0E, 0xD10}, {0xD12, 0xD3A}, {0xD3D, 0xD3D},
    {0xD4E, 0xD4E}, {0xD54, 0xD56}, {0xD5F, 0xD61}, {0xD7A, 0xD7F}, {0xD85, 0xD96}, {0xD9A, 0xDB1},
    {0xDB3, 0xDBB}, {0xDBD, 0xDBD}, {0xDC0, 0xDC6}, {0xE01, 0xE30}, {0xE32, 0xE33}, {0xE40, 0xE46},
    {0xE81, 0xE82}, {0xE84, 0xE84}, {0xE86, 0xE8A}, {0xE8C, 0xEA3}, {0xEA5, 0xEA5}, {0xEA7, 0xEB0},
    {0xEB2, 0xEB3}, {0xEBD, 0xEBD}, {0xEC0, 0xEC4}, {0xEC6, 0xEC6}, {0xEDC, 0xEDF}, {0xF00, 0xF00},
    {0xF40, 0xF47}, {0xF49, 0xF6C}, {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x103F},
    {0x1050, 0x1055}, {0x105A, 0x105D}, {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070},
    {0x1075, 0x1081}, {0x108E, 0x108E}, {0x10A0, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD},
    {0x10D0, 0x10FA}, {0x10FC, 0x1248}, {0x124A, 0x124D}, {0x1250, 0x1256}, {0x1258, 0x1258},
    {0x125A, 0x125D}, {0x1260, 0x1288}, {0x128A, 0x128D}, {0x1290, 0x12B0}, {0x12B2, 0x12B5},
    {0x12B8, 0x12BE}, {0x12C0, 0x12C0}, {0x12C2, 0x12C5}, {0x12C8, 0x12D6}, {0x12D8, 0x1310},
    {0x1312, 0x1315}, {0x1318, 0x135A}, {0x1380, 0x138F}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
    {0x1401, 0x166C}, {0x166F, 0x167F}, {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16F1, 0x16F8},
    {0x1700, 0x1711}, {0x171F, 0x1731}, {0x1740, 0x1751}, {0x1760, 0x176C}, {0x176E, 0x1770},
    {0x1780, 0x17B3}, {0x17D7, 0x17D7}, {0x17DC, 0x17DC}, {0x1820, 0x1878}, {0x1880, 0x1884},
    {0x1887, 0x18A8}, {0x18AA, 0x18AA}, {0x18B0, 0x18F5}, {0x1900, 0x191E}, {0x1950, 0x196D},
    {0x1970, 0x1974}, {0x1980, 0x19AB}, {0x19B0, 0x19C9}, {0x1A00, 0x1A16}, {0x1A20, 0x1A54},
    {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33}, {0x1B45, 0x1B4C}, {0x1B83, 0x1BA0}, {0x1BAE, 0x1BAF},
    {0x1BBA, 0x1BE5}, {0x1C00, 0x1C23}, {0x1C4D, 0x1C4F}, {0x1C5A, 0x1C7D}, {0x1C80, 0x1C88},
    {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6},
    {0x1CFA, 0x1CFA}, {0x1D00, 0x1DBF}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4},
    {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4},
    {0x1FF6, 0x1FFC}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124},
    {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0x2D00, 0x2D25}, {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D}, {0x2D30, 0x2D67},
    {0x2D6F, 0x2D6F}, {0x2D80, 0x2D96}, {0x2DA0, 0x2DA6}, {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6},
    {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6}, {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE},
    {0x2E2F, 0x2E2F}, {0x3005, 0x3006}, {0x3031, 0x3035}, {0x303B, 0x303C}, {0x3041, 0x3096},
    {0x309D, 0x309F}, {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E},
    {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3400, 0x4DBF}, {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD},
    {0xA500, 0xA60C}, {0xA610, 0xA61F}, {0xA62A, 0xA62B}, {0xA640, 0xA66E}, {0xA67F, 0xA69D},
    {0xA6A0, 0xA6E5}, {0xA717, 0xA71F}, {0xA722, 0xA788}, {0xA78B, 0xA7CA}, {0xA7D0, 0xA7D1},
    {0xA7D3, 0xA7D3}, {0xA7D5, 0xA7D9}, {0xA7F2, 0xA801}, {0xA803, 0xA805}, {0xA807, 0xA80A},
    {0xA80C, 0xA822}, {0xA840, 0xA873}, {0xA882, 0xA8B3}, {0xA8F2, 0xA8F7}, {0xA8FB, 0xA8FB},
    {0xA8FD, 0xA8FE}, {0xA90A, 0xA925}, {0xA930, 0xA946}, {0xA960, 0xA97C}, {0xA984, 0xA9B2},
    {0xA9CF, 0xA9CF}, {0xA9E0, 0xA9E4}, {0xA9E6, 0xA9EF}, {0xA9FA, 0xA9FE}, {0xAA00, 0xAA28},
    {0xAA40, 0xAA42}, {0xAA44, 0xAA4B}, {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A}, {0xAA7E, 0xAAAF},
    {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6}, {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0}, {0xAAC2, 0xAAC2},
    {0xAADB, 0xAADD}, {0xAAE0, 0xAAEA}, {0xAAF2, 0xAAF4}, {0xAB01, 0xAB06}, {0xAB09, 0xAB0E},
    {0xAB11, 0xAB16}, {0xAB20, 0xAB26}, {0xAB28, 0xAB2E}, {0xAB30, 0xAB5A}, {0xAB5C, 0xAB69},
    {0xAB70, 0xABE2}, {0xAC00, 0xD7A3}, {0xD7B0, 0xD7C6}, {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D},
    {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFB1D, 0xFB1D}, {0xFB1F, 0xFB28},
    {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41}, {0xFB43, 0xFB44},
    {0xFB46, 0xFBB1}, {0xFBD3, 0xFD3D}, {0xFD50, 0xFD8F}, {0xFD92, 0xFDC7}, {0xFDF0, 0xFDFB},
    {0xFE70, 0xFE74}, {0xFE76, 0xFEFC}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE},
    {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF}, {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0x10000, 0x1000B},
    {0x1000D, 0x10026}, {0x10028, 0x1003A}, {0x1003C, 0x1003D}, {0x1003F, 0x1004D},
    {0x10050, 0x1005D}, {0x10080, 0x100FA}, {0x10280, 0x1029C}, {0x102A0, 0x102D0},
    {0x10300, 0x1031F}, {0x1032D, 0x10340}, {0x10342, 0x10349}, {0x10350, 0x10375},
    {0x10380, 0x1039D}, {0x103A0, 0x103C3}, {0x103C8, 0x103CF}, {0x10400, 0x1049D},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10500, 0x10527}, {0x10530, 0x10563},
    {0x10570, 0x1057A}, {0x1057C, 0x1058A}, {0x1058C, 0x10592}, {0x10594, 0x10595},
    {0x10597, 0x105A1}, {0x105A3, 0x105B1}, {0x105B3, 0x105B9}, {0x105BB, 0x105BC},
    {0x10600, 0x10736}, {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785},
    {0x10787, 0x107B0}, {0x107B2, 0x107BA}, {0x10800, 0x10805}, {0x10808, 0x10808},
    {0x1080A, 0x10835}, {0x10837, 0x10838}, {0x1083C, 0x1083C}, {0x1083F, 0x10855},
    {0x10860, 0x10876}, {0x10880, 0x1089E}, {0x108E0, 0x108F2}, {0x108F4, 0x108F5},
    {0x10900, 0x10915}, {0x10920, 0x10939}, {0x10980, 0x109B7}, {0x109BE, 0x109BF},
    {0x10A00, 0x10A00}, {0x10A10, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35},
    {0x10A60, 0x10A7C}, {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE4},
    {0x10B00, 0x10B35}, {0x10B40, 0x10B55}, {0x10B60, 0x10B72}, {0x10B80, 0x10B91},
    {0x10C00, 0x10C48}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x10D00, 0x10D23},
    {0x10E80, 0x10EA9}, {0x10EB0, 0x10EB1}, {0x10F00, 0x10F1C}, {0x10F27, 0x10F27},
    {0x10F30, 0x10F45}, {0x10F70, 0x10F81}, {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6},
    {0x11003, 0x11037}, {0x11071, 0x11072}, {0x11075, 0x11075}, {0x11083, 0x110AF},
    {0x110D0, 0x110E8}, {0x11103, 0x11126}, {0x11144, 0x11144}, {0x11147, 0x11147},
    {0x11150, 0x11172}, {0x11176, 0x11176}, {0x11183, 0x111B2}, {0x111C1, 0x111C4},
    {0x111DA, 0x111DA}, {0x111DC, 0x111DC}, {0x11200, 0x11211}, {0x11213, 0x1122B},
    {0x11280, 0x11286}, {0x11288, 0x11288}, {0x1128A, 0x1128D}, {0x1128F, 0x1129D},
    {0x1129F, 0x112A8}, {0x112B0, 0x112DE}, {0x11305, 0x1130C}, {0x1130F, 0x11310},
    {0x11313, 0x11328}, {0x1132A, 0x11330}, {0x11332, 0x11333}, {0x11335, 0x11339},
    {0x1133D, 0x1133D}, {0x11350, 0x11350}, {0x1135D, 0x11361}, {0x11400, 0x11434},
    {0x11447, 0x1144A}, {0x1145F, 0x11461}, {0x11480, 0x114AF}, {0x114C4, 0x114C5},
    {0x114C7, 0x114C7}, {0x11580, 0x115AE}, {0x115D8, 0x115DB}, {0x11600, 0x1162F},
    {0x11644, 0x11644}, {0x11680, 0x116AA}, {0x116B8, 0x116B8}, {0x11700, 0x1171A},
    {0x11740, 0x11746}, {0x11800, 0x1182B}, {0x118A0, 0x118DF}, {0x118FF, 0x11906},
    {0x11909, 0x11909}, {0x1190C, 0x11913}, {0x11915, 0x11916}, {0x11918, 0x1192F},
    {0x1193F, 0x1193F}, {0x11941, 0x11941}, {0x119A0, 0x119A7}, {0x119AA, 0x119D0},
    {0x119E1, 0x119E1}, {0x119E3, 0x119E3}, {0x11A00, 0x11A00}, {0x11A0B, 0x11A32},
    {0x11A3A, 0x11A3A}, {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D},
    {0x11AB0, 0x11AF8}, {0x11C00, 0x11C08}, {0x11C0A, 0x11C2E}, {0x11C40, 0x11C40},
    {0x11C72, 0x11C8F}, {0x11D00, 0x11D06}, {0x11D08, 0x11D09}, {0x11D0B, 0x11D30},
    {0x11D46, 0x11D46}, {0x11D60, 0x11D65}, {0x11D67, 0x11D68}, {0x11D6A, 0x11D89},
    {0x11D98, 0x11D98}, {0x11EE0, 0x11EF2}, {0x11FB0, 0x11FB0}, {0x12000, 0x12399},
    {0x12480, 0x12543}, {0x12F90, 0x12FF0}, {0x13000, 0x1342E}, {0x14400, 0x14646},
    {0x16800, 0x16A38}, {0x16A40, 0x16A5E}, {0x16A70, 0x16ABE}, {0x16AD0, 0x16AED},
    {0x16B00, 0x16B2F}, {0x16B40, 0x16B43}, {0x16B63, 0x16B77}, {0x16B7D, 0x16B8F},
    {0x16E40, 0x16E7F}, {0x16F00, 0x16F4A}, {0x16F50, 0x16F50}, {0x16F93, 0x16F9F},
    {0x16FE0, 0x16FE1}, {0x16FE3, 0x16FE3}, {0x17000, 0x187F7}, {0x18800, 0x18CD5},
    {0x18D00, 0x18D08}, {0x1AFF0, 0x1AFF3}, {0x1AFF5, 0x1AFFB}, {0x1AFFD, 0x1AFFE},
    {0x1B000, 0x1B122}, {0x1B150, 0x1B152}, {0x1B164, 0x1B167}, {0x1B170, 0x1B2FB},
    {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C}, {0x1BC80, 0x1BC88}, {0x1BC90, 0x1BC99},
    {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2},
    {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514},
    {0x1D516, 0x1D51C}, {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544},
    {0x1D546, 0x1D546}, {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0},
    {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734},
    {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8},
    {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1E100, 0x1E12C},
    {0x1E137, 0x1E13D}, {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB},
    {0x1E7E0, 0x1E7E6}, {0x1E7E8, 0x1E7EB}, {0x1E7ED, 0x1E7EE}, {0x1E7F0, 0x1E7FE},
    {0x1E800, 0x1E8C4}, {0x1E900, 0x1E943}, {0x1E94B, 0x1E94B}, {0x1EE00, 0x1EE03},
    {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24}, {0x1EE27, 0x1EE27},
    {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39}, {0x1EE3B, 0x1EE3B},
    {0x1EE42, 0x1EE42}, {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49}, {0x1EE4B, 0x1EE4B},
    {0x1EE4D, 0x1EE4F}, {0x1EE51, 0x1EE52}, {0x1EE54, 0x1EE54}, {0x1EE57, 0x1EE57},
    {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B}, {0x1EE5D, 0x1EE5D}, {0x1EE5F, 0x1EE5F},
    {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A}, {0x1EE6C, 0x1EE72},
    {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E}, {0x1EE80, 0x1EE89},
    {0x1EE8B, 0x1EE9B}, {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9}, {0x1EEAB, 0x1EEBB},
    {0x20000, 0x2A6DF}, {0x2A700, 0x2B738}, {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1},
    {0x2CEB0, 0x2EBE0}, {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
};
/* General_Category N* (numbers): 134 ranges [lo, hi] of code points, sorted. */
static const uint32_t uni_number[][2] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9},
    {0x7C0, 0x7C9}, {0x966, 0x96F}, {0x9E6, 0x9EF}, {0x9F4, 0x9F9}, {0xA66, 0xA6F}, {0xAE6, 0xAEF},
    {0xB66, 0xB6F}, {0xB72, 0xB77}, {0xBE6, 0xBF2}, {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xCE6, 0xCEF},
    {0xD58, 0xD5E}, {0xD66, 0xD78}, {0xDE6, 0xDEF}, {0xE50, 0xE59}, {0xED0, 0xED9}, {0xF20, 0xF33},
    {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9},
    {0x17F0, 0x17F9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89},
    {0x1A90, 0x1A99}, {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189},
    {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007},
    {0x3021, 0x3029}, {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F},
    {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF},
    {0xA830, 0xA835}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9},
    {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x10178},
    {0x1018A, 0x1018B}, {0x102E1, 0x102FB}, {0x10320, 0x10323}, {0x10341, 0x10341},
    {0x1034A, 0x1034A}, {0x103D1, 0x103D5}, {0x104A0, 0x104A9}, {0x10858, 0x1085F},
    {0x10879, 0x1087F}, {0x108A7, 0x108AF}, {0x108FB, 0x108FF}, {0x10916, 0x1091B},
    {0x109BC, 0x109BD}, {0x109C0, 0x109CF}, {0x109D2, 0x109FF}, {0x10A40, 0x10A48},
    {0x10A7D, 0x10A7E}, {0x10A9D, 0x10A9F}, {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F},
    {0x10B78, 0x10B7F}, {0x10BA9, 0x10BAF}, {0x10CFA, 0x10CFF}, {0x10D30, 0x10D39},
    {0x10E60, 0x10E7E}, {0x10F1D, 0x10F26}, {0x10F51, 0x10F54}, {0x10FC5, 0x10FCB},
    {0x11052, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F}, {0x111D0, 0x111D9},
    {0x111E1, 0x111F4}, {0x112F0, 0x112F9}, {0x11450, 0x11459}, {0x114D0, 0x114D9},
    {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x1173B}, {0x118E0, 0x118F2},
    {0x11950, 0x11959}, {0x11C50, 0x11C6C}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9},
    {0x11FC0, 0x11FD4}, {0x12400, 0x1246E}, {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9},
    {0x16B50, 0x16B59}, {0x16B5B, 0x16B61}, {0x16E80, 0x16E96}, {0x1D2E0, 0x1D2F3},
    {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9},
    {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF},
    {0x1ECB1, 0x1ECB4}, {0x1ED01, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C},
    {0x1FBF0, 0x1FBF9},
};
/* General_Category M* (combining marks): 299 ranges [lo, hi], sorted. */
static const uint32_t uni_mark[][2] = {
    {0x300, 0x36F}, {0x483, 0x489}, {0x591, 0x5BD}, {0x5BF, 0x5BF}, {0x5C1, 0x5C2}, {0x5C4, 0x5C5},
    {0x5C7, 0x5C7}, {0x610, 0x61A}, {0x64B, 0x65F}, {0x670, 0x670}, {0x6D6, 0x6DC}, {0x6DF, 0x6E4},
    {0x6E7, 0x6E8}, {0x6EA, 0x6ED}, {0x711, 0x711}, {0x730, 0x74A}, {0x7A6, 0x7B0}, {0x7EB, 0x7F3},
    {0x7FD, 0x7FD}, {0x816, 0x819}, {0x81B, 0x823}, {0x825, 0x827}, {0x829, 0x82D}, {0x859, 0x85B},
    {0x898, 0x89F}, {0x8CA, 0x8E1}, {0x8E3, 0x903}, {0x93A, 0x93C}, {0x93E, 0x94F}, {0x951, 0x957},
    {0x962, 0x963}, {0x981, 0x983}, {0x9BC, 0x9BC}, {0x9BE, 0x9C4}, {0x9C7, 0x9C8}, {0x9CB, 0x9CD},
    {0x9D7, 0x9D7}, {0x9E2, 0x9E3}, {0x9FE, 0x9FE}, {0xA01, 0xA03}, {0xA3C, 0xA3C}, {0xA3E, 0xA42},
    {0xA47, 0xA48}, {0xA4B, 0xA4D}, {0xA51, 0xA51}, {0xA70, 0xA71}, {0xA75, 0xA75}, {0xA81, 0xA83},
    {0xABC, 0xABC}, {0xABE, 0xAC5}, {0xAC7, 0xAC9}, {0xACB, 0xACD}, {0xAE2, 0xAE3}, {0xAFA, 0xAFF},
    {0xB01, 0xB03}, {0xB3C, 0xB3C}, {0xB3E, 0xB44}, {0xB47, 0xB48}, {0xB4B, 0xB4D}, {0xB55, 0xB57},
    {0xB62, 0xB63}, {0xB82, 0xB82}, {0xBBE, 0xBC2}, {0xBC6, 0xBC8}, {0xBCA, 0xBCD}, {0xBD7, 0xBD7},
    {0xC00, 0xC04}, {0xC3C, 0xC3C}, {0xC3E, 0xC44}, {0xC46, 0xC48}, {0xC4A, 0xC4D}, {0xC55, 0xC56},
    {0xC62, 0xC63}, {0xC81, 0xC83}, {0xCBC, 0xCBC}, {0xCBE, 0xCC4}, {0xCC6, 0xCC8}, {0xCCA, 0xCCD},
    {0xCD5, 0xCD6}, {0xCE2, 0xCE3}, {0xD00, 0xD03}, {0xD3B, 0xD3C}, {0xD3E, 0xD44}, {0xD46, 0xD48},
    {0xD4A, 0xD4D}, {0xD57, 0xD57}, {0xD62, 0xD63}, {0xD81, 0xD83}, {0xDCA, 0xDCA}, {0xDCF, 0xDD4},
    {0xDD6, 0xDD6}, {0xDD8, 0xDDF}, {0xDF2, 0xDF3}, {0xE31, 0xE31}, {0xE34, 0xE3A}, {0xE47, 0xE4E},
    {0xEB1, 0xEB1}, {0xEB4, 0xEBC}, {0xEC8, 0xECD}, {0xF18, 0xF19}, {0xF35, 0xF35}, {0xF37, 0xF37},
    {0xF39, 0xF39}, {0xF3E, 0xF3F}, {0xF71, 0xF84}, {0xF86, 0xF87}, {0xF8D, 0xF97}, {0xF99, 0xFBC},
    {0xFC6, 0xFC6}, {0x102B, 0x103E}, {0x1056, 0x1059}, {0x105E, 0x1060}, {0x1062, 0x1064}, {0x1067, 0x106D},
    {0x1071, 0x1074}, {0x1082, 0x108D}, {0x108F, 0x108F}, {0x109A, 0x109D}, {0x135D, 0x135F}, {0x1712, 0x1715},
    {0x1732, 0x1734}, {0x1752, 0x1753}, {0x1772, 0x1773}, {0x17B4, 0x17D3}, {0x17DD, 0x17DD}, {0x180B, 0x180D},
    {0x180F, 0x180F}, {0x1885, 0x1886}, {0x18A9, 0x18A9}, {0x1920, 0x192B}, {0x1930, 0x193B}, {0x1A17, 0x1A1B},
    {0x1A55, 0x1A5E}, {0x1A60, 0x1A7C}, {0x1A7F, 0x1A7F}, {0x1AB0, 0x1ACE}, {0x1B00, 0x1B04}, {0x1B34, 0x1B44},
    {0x1B6B, 0x1B73}, {0x1B80, 0x1B82}, {0x1BA1, 0x1BAD}, {0x1BE6, 0x1BF3}, {0x1C24, 0x1C37}, {0x1CD0, 0x1CD2},
    {0x1CD4, 0x1CE8}, {0x1CED, 0x1CED}, {0x1CF4, 0x1CF4}, {0x1CF7, 0x1CF9}, {0x1DC0, 0x1DFF}, {0x20D0, 0x20F0},
    {0x2CEF, 0x2CF1}, {0x2D7F, 0x2D7F}, {0x2DE0, 0x2DFF}, {0x302A, 0x302F}, {0x3099, 0x309A}, {0xA66F, 0xA672},
    {0xA674, 0xA67D}, {0xA69E, 0xA69F}, {0xA6F0, 0xA6F1}, {0xA802, 0xA802}, {0xA806, 0xA806}, {0xA80B, 0xA80B},
    {0xA823, 0xA827}, {0xA82C, 0xA82C}, {0xA880, 0xA881}, {0xA8B4, 0xA8C5}, {0xA8E0, 0xA8F1}, {0xA8FF, 0xA8FF},
    {0xA926, 0xA92D}, {0xA947, 0xA953}, {0xA980, 0xA983}, {0xA9B3, 0xA9C0}, {0xA9E5, 0xA9E5}, {0xAA29, 0xAA36},
    {0xAA43, 0xAA43}, {0xAA4C, 0xAA4D}, {0xAA7B, 0xAA7D}, {0xAAB0, 0xAAB0}, {0xAAB2, 0xAAB4}, {0xAAB7, 0xAAB8},
    {0xAABE, 0xAABF}, {0xAAC1, 0xAAC1}, {0xAAEB, 0xAAEF}, {0xAAF5, 0xAAF6}, {0xABE3, 0xABEA}, {0xABEC, 0xABED},
    {0xFB1E, 0xFB1E}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE2F}, {0x101FD, 0x101FD}, {0x102E0, 0x102E0},
    {0x10376, 0x1037A}, {0x10A01, 0x10A03}, {0x10A05, 0x10A06}, {0x10A0C, 0x10A0F}, {0x10A38, 0x10A3A},
    {0x10A3F, 0x10A3F}, {0x10AE5, 0x10AE6}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11000, 0x11002}, {0x11038, 0x11046}, {0x11070, 0x11070}, {0x11073, 0x11074},
    {0x1107F, 0x11082}, {0x110B0, 0x110BA}, {0x110C2, 0x110C2}, {0x11100, 0x11102}, {0x11127, 0x11134},
    {0x11145, 0x11146}, {0x11173, 0x11173}, {0x11180, 0x11182}, {0x111B3, 0x111C0}, {0x111C9, 0x111CC},
    {0x111CE, 0x111CF}, {0x1122C, 0x11237}, {0x1123E, 0x1123E}, {0x112DF, 0x112EA}, {0x11300, 0x11303},
    {0x1133B, 0x1133C}, {0x1133E, 0x11344}, {0x11347, 0x11348}, {0x1134B, 0x1134D}, {0x11357, 0x11357},
    {0x11362, 0x11363}, {0x11366, 0x1136C}, {0x11370, 0x11374}, {0x11435, 0x11446}, {0x1145E, 0x1145E},
    {0x114B0, 0x114C3}, {0x115AF, 0x115B5}, {0x115B8, 0x115C0}, {0x115DC, 0x115DD}, {0x11630, 0x11640},
    {0x116AB, 0x116B7}, {0x1171D, 0x1172B}, {0x1182C, 0x1183A}, {0x11930, 0x11935}, {0x11937, 0x11938},
    {0x1193B, 0x1193E}, {0x11940, 0x11940}, {0x11942, 0x11943}, {0x119D1, 0x119D7}, {0x119DA, 0x119E0},
    {0x119E4, 0x119E4}, {0x11A01, 0x11A0A}, {0x11A33, 0x11A39}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47},
    {0x11A51, 0x11A5B}, {0x11A8A, 0x11A99}, {0x11C2F, 0x11C36}, {0x11C38, 0x11C3F}, {0x11C92, 0x11CA7},
    {0x11CA9, 0x11CB6}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D}, {0x11D3F, 0x11D45},
    {0x11D47, 0x11D47}, {0x11D8A, 0x11D8E}, {0x11D90, 0x11D91}, {0x11D93, 0x11D97}, {0x11EF3, 0x11EF6},
    {0x16AF0, 0x16AF4}, {0x16B30, 0x16B36}, {0x16F4F, 0x16F4F}, {0x16F51, 0x16F87}, {0x16F8F, 0x16F92},
    {0x16FE4, 0x16FE4}, {0x16FF0, 0x16FF1}, {0x1BC9D, 0x1BC9E}, {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46},
    {0x1D165, 0x1D169}, {0x1D16D, 0x1D172}, {0x1D17B, 0x1D182}, {0x1D185, 0x1D18B}, {0x1D1AA, 0x1D1AD},
    {0x1D242, 0x1D244}, {0x1DA00, 0x1DA36}, {0x1DA3B, 0x1DA6C}, {0x1DA75, 0x1DA75}, {0x1DA84, 0x1DA84},
    {0x1DA9B, 0x1DA9F}, {0x1DAA1, 0x1DAAF}, {0x1E000, 0x1E006}, {0x1E008, 0x1E018}, {0x1E01B, 0x1E021},
    {0x1E023, 0x1E024}, {0x1E026, 0x1E02A}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E8D0, 0x1E8D6}, {0x1E944, 0x1E94A}, {0xE0100, 0xE01EF}};

/* General_Category P* (punctuation) above ASCII: 180 ranges, sorted. */
static const uint32_t uni_punct[][2] = {
    {0xA1, 0xA1}, {0xA7, 0xA7}, {0xAB, 0xAB}, {0xB6, 0xB7}, {0xBB, 0xBB}, {0xBF, 0xBF}, {0x37E, 0x37E},
    {0x387, 0x387}, {0x55A, 0x55F}, {0x589, 0x58A}, {0x5BE, 0x5BE}, {0x5C0, 0x5C0}, {0x5C3, 0x5C3},
    {0x5C6, 0x5C6}, {0x5F3, 0x5F4}, {0x609, 0x60A}, {0x60C, 0x60D}, {0x61B, 0x61B}, {0x61D, 0x61F},
    {0x66A, 0x66D}, {0x6D4, 0x6D4}, {0x700, 0x70D}, {0x7F7, 0x7F9}, {0x830, 0x83E}, {0x85E, 0x85E},
    {0x964, 0x965}, {0x970, 0x970}, {0x9FD, 0x9FD}, {0xA76, 0xA76}, {0xAF0, 0xAF0}, {0xC77, 0xC77},
    {0xC84, 0xC84}, {0xDF4, 0xDF4}, {0xE4F, 0xE4F}, {0xE5A, 0xE5B}, {0xF04, 0xF12}, {0xF14, 0xF14},
    {0xF3A, 0xF3D}, {0xF85, 0xF85}, {0xFD0, 0xFD4}, {0xFD9, 0xFDA}, {0x104A, 0x104F}, {0x10FB, 0x10FB},
    {0x1360, 0x1368}, {0x1400, 0x1400}, {0x166E, 0x166E}, {0x169B, 0x169C}, {0x16EB, 0x16ED}, {0x1735, 0x1736},
    {0x17D4, 0x17D6}, {0x17D8, 0x17DA}, {0x1800, 0x180A}, {0x1944, 0x1945}, {0x1A1E, 0x1A1F}, {0x1AA0, 0x1AA6},
    {0x1AA8, 0x1AAD}, {0x1B5A, 0x1B60}, {0x1B7D, 0x1B7E}, {0x1BFC, 0x1BFF}, {0x1C3B, 0x1C3F}, {0x1C7E, 0x1C7F},
    {0x1CC0, 0x1CC7}, {0x1CD3, 0x1CD3}, {0x2010, 0x2027}, {0x2030, 0x2043}, {0x2045, 0x2051}, {0x2053, 0x205E},
    {0x207D, 0x207E}, {0x208D, 0x208E}, {0x2308, 0x230B}, {0x2329, 0x232A}, {0x2768, 0x2775}, {0x27C5, 0x27C6},
    {0x27E6, 0x27EF}, {0x2983, 0x2998}, {0x29D8, 0x29DB}, {0x29FC, 0x29FD}, {0x2CF9, 0x2CFC}, {0x2CFE, 0x2CFF},
    {0x2D70, 0x2D70}, {0x2E00, 0x2E2E}, {0x2E30, 0x2E4F}, {0x2E52, 0x2E5D}, {0x3001, 0x3003}, {0x3008, 0x3011},
    {0x3014, 0x301F}, {0x3030, 0x3030}, {0x303D, 0x303D}, {0x30A0, 0x30A0}, {0x30FB, 0x30FB}, {0xA4FE, 0xA4FF},
    {0xA60D, 0xA60F}, {0xA673, 0xA673}, {0xA67E, 0xA67E}, {0xA6F2, 0xA6F7}, {0xA874, 0xA877}, {0xA8CE, 0xA8CF},
    {0xA8F8, 0xA8FA}, {0xA8FC, 0xA8FC}, {0xA92E, 0xA92F}, {0xA95F, 0xA95F}, {0xA9C1, 0xA9CD}, {0xA9DE, 0xA9DF},
    {0xAA5C, 0xAA5F}, {0xAADE, 0xAADF}, {0xAAF0, 0xAAF1}, {0xABEB, 0xABEB}, {0xFD3E, 0xFD3F}, {0xFE10, 0xFE19},
    {0xFE30, 0xFE52}, {0xFE54, 0xFE61}, {0xFE63, 0xFE63}, {0xFE68, 0xFE68}, {0xFE6A, 0xFE6B}, {0xFF01, 0xFF03},
    {0xFF05, 0xFF0A}, {0xFF0C, 0xFF0F}, {0xFF1A, 0xFF1B}, {0xFF1F, 0xFF20}, {0xFF3B, 0xFF3D}, {0xFF3F, 0xFF3F},
    {0xFF5B, 0xFF5B}, {0xFF5D, 0xFF5D}, {0xFF5F, 0xFF65}, {0x10100, 0x10102}, {0x1039F, 0x1039F},
    {0x103D0, 0x103D0}, {0x1056F, 0x1056F}, {0x10857, 0x10857}, {0x1091F, 0x1091F}, {0x1093F, 0x1093F},
    {0x10A50, 0x10A58}, {0x10A7F, 0x10A7F}, {0x10AF0, 0x10AF6}, {0x10B39, 0x10B3F}, {0x10B99, 0x10B9C},
    {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x11047, 0x1104D}, {0x110BB, 0x110BC},
    {0x110BE, 0x110C1}, {0x11140, 0x11143}, {0x11174, 0x11175}, {0x111C5, 0x111C8}, {0x111CD, 0x111CD},
    {0x111DB, 0x111DB}, {0x111DD, 0x111DF}, {0x11238, 0x1123D}, {0x112A9, 0x112A9}, {0x1144B, 0x1144F},
    {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x114C6, 0x114C6}, {0x115C1, 0x115D7}, {0x11641, 0x11643},
    {0x11660, 0x1166C}, {0x116B9, 0x116B9}, {0x1173C, 0x1173E}, {0x1183B, 0x1183B}, {0x11944, 0x11946},
    {0x119E2, 0x119E2}, {0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C}, {0x11A9E, 0x11AA2}, {0x11C41, 0x11C45},
    {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8}, {0x11FFF, 0x11FFF}, {0x12470, 0x12474}, {0x12FF1, 0x12FF2},
    {0x16A6E, 0x16A6F}, {0x16AF5, 0x16AF5}, {0x16B37, 0x16B3B}, {0x16B44, 0x16B44}, {0x16E97, 0x16E9A},
    {0x16FE2, 0x16FE2}, {0x1BC9F, 0x1BC9F}, {0x1DA87, 0x1DA8B}, {0x1E95E, 0x1E95F},
};
/* deepseek-llm's letter class (the Lu/Ll/Lt letters its tokenizer.json lists, copied
 * as code points, not glyphs: several have look-alikes): 84 ranges, sorted. */
static const uint32_t ds_letter[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
    {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3},
    {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

enum { CAT_OTHER = 0, CAT_LETTER = 1, CAT_NUMBER = 2, CAT_SPACE = 3 };

/* \s as the published regexes (and llama.cpp) use it. */
static int is_space_cp(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int cp_category(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CAT_LETTER;
        if (cp >= '0' && cp <= '9') return CAT_NUMBER;
        return is_space_cp(cp) ? CAT_SPACE : CAT_OTHER;
    }
    if (is_space_cp(cp)) return CAT_SPACE;
    if (in_ranges(uni_letter, sizeof uni_letter / sizeof uni_letter[0], cp)) return CAT_LETTER;
    if (in_ranges(uni_number, sizeof uni_number / sizeof uni_number[0], cp)) return CAT_NUMBER;
    return CAT_OTHER;
}

/* Strict UTF-8 decode of one code point at s[0..left): *n = bytes used.
 * An invalid or truncated sequence decodes as one byte, code point
 * 0xFFFD (category OTHER), so every byte lands in exactly one word. */
static uint32_t utf8_decode(const uint8_t *s, int64_t left, int64_t *n) {
    uint8_t b = s[0];
    *n = 1;
    if (b < 0x80) return b;
    int len = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
    if (len == 0 || len > left || (len == 4 && b > 0xF4)) return 0xFFFD;
    uint32_t cp = b & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
    *n = len;
    return cp;
}

/* UTF-8 as llama.cpp decodes it for byte-level BPE (unicode_cpt_from_utf8,
 * and the U+FFFD unicode_cpts_from_utf8 puts for what that refuses): the
 * lead byte gives the length and only the continuation bytes are checked,
 * so overlong forms and surrogates pass as the code points they spell;
 * anything else is U+FFFD for one byte (*n = 1). Above U+10FFFF (leads F4
 * 90.. to F7), where llama.cpp fails when it encodes the word, U+FFFD too. */
static uint32_t bpe_decode(const uint8_t *s, int64_t left, int64_t *n) {
    uint8_t b = s[0];
    *n = 1;
    if (b < 0x80) return b;
    int len = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > left) return 0xFFFD;
    uint32_t cp = b & (0xFFu >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp > 0x10FFFF) return 0xFFFD;
    *n = len;
    return cp;
}

/* Bytes of the character at s: its UTF-8 length when valid, else 1. (llama.cpp
 * trusts the lead byte, so an invalid lead byte swallows the '▁' of a
 * following space and the round trip loses it; strict splitting keeps it:
 * the two agree on valid UTF-8.) */
static int64_t spm_char_len(const char *s, int64_t left) {
    int64_t n;
    (void)utf8_decode((const uint8_t *)s, left, &n);
    return n;
}

static int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* --------------------------------------------------------------------- */
/* String table: (text, len) -> index, open addressing                    */

typedef struct {
    const char *arena;
    const int64_t *off; /* (n,) start of string i in arena */
    const int32_t *len; /* (n,) */
    int64_t n;
    int32_t *slots; /* (mask+1,) index+1, 0 = empty */
    uint64_t mask;
} strtab;

static uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* last_wins: a duplicate string maps to its last index (the token map of
 * llama.cpp) or to its first (merge ranks). */
static dhsa_status strtab_build(strtab *st, int last_wins) {
    uint64_t cap = 16;
    while (cap < (uint64_t)st->n * 2) cap <<= 1;
    st->slots = calloc(cap, sizeof *st->slots);
    if (!st->slots) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for a %llu-slot table",
                                      (unsigned long long)cap);
    st->mask = cap - 1;
    for (int64_t i = 0; i < st->n; i++) {
        const char *s = st->arena + st->off[i];
        uint64_t h = hash_bytes(s, st->len[i]) & st->mask;
        for (;; h = (h + 1) & st->mask) {
            int32_t k = st->slots[h];
            if (k == 0) {
                st->slots[h] = (int32_t)(i + 1);
                break;
            }
            if (st->len[k - 1] == st->len[i] && memcmp(st->arena + st->off[k - 1], s, (size_t)st->len[i]) == 0) {
                if (last_wins) st->slots[h] = (int32_t)(i + 1);
                break;
            }
        }
    }
    return DHSA_OK;
}

static int32_t strtab_find(const strtab *st, const char *s, int64_t n) {
    if (!st->slots) return -1;
    for (uint64_t h = hash_bytes(s, n) & st->mask;; h = (h + 1) & st->mask) {
        int32_t k = st->slots[h];
        if (k == 0) return -1;
        if (st->len[k - 1] == n && memcmp(st->arena + st->off[k - 1], s, (size_t)n) == 0) return k - 1;
    }
}

/* --------------------------------------------------------------------- */
/* The tokenizer                                                          */

struct dhsa_tokenizer {
    dhsa_tokenizer_kind kind;
    dhsa_tok_pre pre;
    unsigned pre_flags; /* DHSA_TOK_PRE_IGNORE_MERGES, ... */
    int64_t n_vocab;
    char *tok_arena;  /* all token texts, each NUL-terminated */
    int64_t *tok_off; /* (n_vocab,) */
    int32_t *tok_len; /* (n_vocab,) */
    float *scores;    /* (n_vocab,) SPM merge priority; 0 when absent */
    uint8_t *types;   /* (n_vocab,) dhsa_token_type */
    strtab tokens;
    /* BPE merges "left right", rank = index */
    char *merge_arena;
    int64_t *merge_off;
    int32_t *merge_len;
    strtab merges;
    int32_t bos, eos, unk;
    int add_bos, add_eos, add_space_prefix;
    int32_t byte_tok[256]; /* SPM: id of <0xXX>, -1 when absent */
    uint8_t cp_to_byte[512]; /* BPE: inverse byte-to-unicode map (cp < 512) */
    uint8_t cp_is_byte[512];
    uint16_t byte_to_cp[256];
    uint8_t *attr; /* (n_vocab,) ATTR_* bits: the type, then the rules of llama.cpp (docs/tokenizer.md) */
    /* Special tokens (attr CONTROL, USER_DEFINED or UNKNOWN, text not
     * empty), in the order they are cut out of a text: longest first, ties
     * by id; and the same tokens in byte order of their texts (indices into
     * specials), to find which of them a text holds. */
    int32_t *specials;   /* (n_specials,) ids */
    int32_t *special_lex; /* (n_specials,) */
    int64_t n_specials;
};

/* Token attributes: what llama.cpp calls llama_token_attr (its bit values
 * are not stored anywhere, so these are dhsa's own). */
enum {
    ATTR_UNKNOWN = 1,
    ATTR_UNUSED = 2,
    ATTR_NORMAL = 4,
    ATTR_CONTROL = 8,
    ATTR_USER_DEFINED = 16,
    ATTR_BYTE = 32,
    ATTR_LSTRIP = 64, /* cutting the token out also drops the whitespace before it */
    ATTR_RSTRIP = 128 /* ... and after it */
};
#define ATTR_SPECIAL (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) /* cut out before the model's algorithm */
#define ATTR_PARSE_ONLY (ATTR_CONTROL | ATTR_UNKNOWN) /* ... only with DHSA_TOKENIZE_PARSE_SPECIAL */

static void gpt2_byte_map(dhsa_tokenizer *t) {
    /* Printable bytes map to themselves; the rest to 256, 257, ... */
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint16_t cp = (uint16_t)(printable ? b : 256 + n++);
        t->byte_to_cp[b] = cp;
        t->cp_to_byte[cp] = (uint8_t)b;
        t->cp_is_byte[cp] = 1;
    }
}

void dhsa_tokenizer_free(dhsa_tokenizer *t) {
    if (!t) return;
    free(t->tok_arena);
    free(t->tok_off);
    free(t->tok_len);
    free(t->scores);
    free(t->types);
    free(t->attr);
    free(t->tokens.slots);
    free(t->merge_arena);
    free(t->merge_off);
    free(t->merge_len);
    free(t->merges.slots);
    free(t->specials);
    free(t->special_lex);
    free(t);
}

/* Copies n GGUF strings into one arena (NUL after each). */
static dhsa_status copy_strings(const dhsa_gguf_str *src, int64_t n, const char *key, char **arena, int64_t **off,
                                int32_t **len) {
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (src[i].len < 0 || src[i].len > DHSA_TOKENIZER_MAX_TOKEN_BYTES)
            return dhsa__fail(DHSA_ERR_TOO_LARGE, "tokenizer: %s[%lld] is %lld bytes long (limit %d)", key,
                              (long long)i, (long long)src[i].len, DHSA_TOKENIZER_MAX_TOKEN_BYTES);
        total += (uint64_t)src[i].len + 1;
    }
    *arena = malloc(total ? total : 1);
    *off = malloc(sizeof **off * (size_t)(n ? n : 1));
    *len = malloc(sizeof **len * (size_t)(n ? n : 1));
    if (!*arena || !*off || !*len)
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory copying %s", key);
    uint64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        (*off)[i] = (int64_t)pos;
        (*len)[i] = (int32_t)src[i].len;
        if (src[i].len) memcpy(*arena + pos, src[i].str, (size_t)src[i].len);
        (*arena)[pos + (uint64_t)src[i].len] = 0;
        pos += (uint64_t)src[i].len + 1;
    }
    return DHSA_OK;
}

/* An optional id key: absent -> def; a value outside the vocab -> -1
 * (files write 0xFFFFFFFF for "none"). */
static dhsa_status opt_id(const dhsa_gguf *g, const char *key, int64_t n_vocab, int32_t def, int32_t *out) {
    *out = def;
    if (dhsa_gguf_find_kv(g, key) < 0) return DHSA_OK;
    int64_t v;
    uint64_t u;
    if (dhsa_gguf_get_i64(g, key, &v) == DHSA_OK) {
        *out = v >= 0 && v < n_vocab ? (int32_t)v : -1;
        return DHSA_OK;
    }
    if (dhsa_gguf_get_u64(g, key, &u) == DHSA_OK) {
        *out = u < (uint64_t)n_vocab ? (int32_t)u : -1;
        return DHSA_OK;
    }
    return dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: %s is not an integer", key);
}

static dhsa_status opt_bool(const dhsa_gguf *g, const char *key, int def, int *out) {
    *out = def;
    if (dhsa_gguf_find_kv(g, key) < 0) return DHSA_OK;
    return dhsa_gguf_get_bool(g, key, out);
}

/* Every tokenizer.ggml.pre name llama.cpp's loader knows (src/llama-vocab.cpp,
 * llama_vocab::impl::load, llama-cpp-python 0.3.36's vendored copy), in its
 * order, with the regex set it selects and the flags it sets. A set dhsa
 * has not written is NONE with the reason: those names are refused by name
 * (docs/tokenizer.md). */
#define IGN DHSA_TOK_PRE_IGNORE_MERGES
#define BOS DHSA_TOK_PRE_ADD_BOS
typedef struct {
    const char *name;
    dhsa_tok_pre pre;
    unsigned flags;
    const char *why; /* NONE: what the set needs */
} pre_entry;
static const char WHY_MARKS[] = "its regexes use \\p{M} or \\p{S} in rules dhsa has not written";
static const char WHY_SPM_BPE[] = "it is a SentencePiece-style BPE over raw UTF-8 (no byte mapping)";
static const pre_entry pre_table[] = {
    {"default", DHSA_TOK_PRE_DEFAULT, 0, NULL},
    {"minicpm5", DHSA_TOK_PRE_MINICPM5, IGN, NULL},
    {"llama3", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"llama-v3", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"llama-bpe", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"falcon3", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"falcon-h1", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"pixtral", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"midm-2.0", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"lfm2", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"jina-v5-nano", DHSA_TOK_PRE_LLAMA3, IGN | BOS, NULL},
    {"deepseek-llm", DHSA_TOK_PRE_DEEPSEEK_LLM, 0, NULL},
    {"deepseek-coder", DHSA_TOK_PRE_DEEPSEEK_CODER, 0, NULL},
    {"deepseek-v3", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"spark2_5", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"youtu", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"falcon", DHSA_TOK_PRE_FALCON, 0, NULL},
    {"mpt", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"starcoder", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"gpt-2", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"phi-2", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-es", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-de", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"gigachat", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-v2-es", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jina-v2-de", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"a.x-4.0", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"mellum", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"modern-bert", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"jais-2", DHSA_TOK_PRE_JAIS2, 0, NULL},
    {"gemma4", DHSA_TOK_PRE_NONE, 0, WHY_SPM_BPE},
    {"granite-embed-multi-311m", DHSA_TOK_PRE_NONE, 0, WHY_SPM_BPE},
    {"sarvam-moe", DHSA_TOK_PRE_NONE, 0, WHY_SPM_BPE},
    {"jina-v1-en", DHSA_TOK_PRE_NONE, 0, "it adds a SEP token after the text (a BERT-style encoder vocabulary)"},
    {"jina-v2-code", DHSA_TOK_PRE_NONE, 0, "it adds a SEP token after the text (a BERT-style encoder vocabulary)"},
    {"roberta-bpe", DHSA_TOK_PRE_NONE, 0, "it adds a SEP token after the text (a BERT-style encoder vocabulary)"},
    {"whitespace", DHSA_TOK_PRE_NONE, 0, "it splits on whitespace over raw UTF-8 (no byte mapping)"},
    {"refact", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"command-r", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"qwen2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"deepseek-r1-qwen", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"kormo", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"f2llmv2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"qwen35", DHSA_TOK_PRE_QWEN35, 0, NULL},
    {"stablelm2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"olmo", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"dbrx", DHSA_TOK_PRE_LLAMA3, 0, NULL},
    {"smaug-bpe", DHSA_TOK_PRE_LLAMA3, 0, NULL},
    {"poro-chat", DHSA_TOK_PRE_BLOOM, 0, NULL},
    {"chatglm-bpe", DHSA_TOK_PRE_LLAMA3, 0, NULL},
    {"glm4", DHSA_TOK_PRE_LLAMA3, IGN, NULL},
    {"glm5", DHSA_TOK_PRE_LLAMA3, IGN, NULL},
    {"viking", DHSA_TOK_PRE_VIKING, 0, NULL},
    {"jais", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"tekken", DHSA_TOK_PRE_TEKKEN, IGN | BOS, NULL},
    {"smollm", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"codeshell", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"bloom", DHSA_TOK_PRE_BLOOM, 0, NULL},
    {"gpt3-finnish", DHSA_TOK_PRE_BLOOM, 0, NULL},
    {"exaone", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"exaone4", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"exaone-moe", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"chameleon", DHSA_TOK_PRE_NONE, 0, "its regexes cut image and sentinel tokens out of the text"},
    {"minerva-7b", DHSA_TOK_PRE_STARCODER, 0, NULL},
    {"megrez", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"gpt-4o", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"llama4", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"kanana2", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"talkie", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"granite-embed-multi-97m", DHSA_TOK_PRE_GRANITE_MULTI, IGN, NULL},
    {"tiny_aya", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"cohere2moe", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"superbpe", DHSA_TOK_PRE_NONE, 0, "its second regex is an empty-match lookahead ((?=(\\d{3})+(?!\\d)))"},
    {"trillion", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"granite-docling", DHSA_TOK_PRE_GPT2, 0, NULL},
    {"bailingmoe", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"bailingmoe2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"llada-moe", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"seed-coder", DHSA_TOK_PRE_SEED_CODER, 0, NULL},
    {"hunyuan", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"hunyuan-dense", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"hy_v4", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"joyai-llm", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"kimi-k2", DHSA_TOK_PRE_NONE, 0, "its Han-script rules are a hand-written splitter in llama.cpp, not a regex"},
    {"ufakzeka", DHSA_TOK_PRE_UFAKZEKA, 0, NULL},
    {"grok-2", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"afmoe", DHSA_TOK_PRE_NONE, 0, WHY_MARKS},
    {"laguna", DHSA_TOK_PRE_LAGUNA, 0, NULL},
    {"minimax-m2", DHSA_TOK_PRE_GPT4O, 0, NULL},
    {"solar-open", DHSA_TOK_PRE_QWEN2, 0, NULL},
    {"mellum2", DHSA_TOK_PRE_STARCODER, 0, NULL},
};
#undef IGN
#undef BOS
#define N_PRE (sizeof pre_table / sizeof pre_table[0])

const char *dhsa_tok__pre_name(size_t i) { return i < N_PRE ? pre_table[i].name : NULL; }

int dhsa_tok__pre_lookup(const char *name, dhsa_tok_pre *pre, unsigned *flags, const char **why) {
    *pre = DHSA_TOK_PRE_NONE;
    *flags = 0;
    *why = "llama.cpp does not know it either";
    for (size_t i = 0; i < N_PRE; i++)
        if (strcmp(name, pre_table[i].name) == 0) {
            *pre = pre_table[i].pre;
            *flags = pre_table[i].flags;
            *why = pre_table[i].why;
            return 1;
        }
    return 0;
}

/* "name, name, ..." of every name that runs, for the refusal. */
static void supported_pre_names(char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_PRE && k + 1 < cap; i++) {
        if (pre_table[i].pre == DHSA_TOK_PRE_NONE) continue;
        int w = snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", pre_table[i].name);
        if (w < 0 || (size_t)w >= cap - k) break;
        k += (size_t)w;
    }
}

dhsa_status dhsa_tok__set_pre(dhsa_tokenizer *t, const char *pre, int file_sets_add_bos) {
    const char *why = NULL;
    dhsa_tok_pre kind;
    unsigned flags;
    int known = dhsa_tok__pre_lookup(pre, &kind, &flags, &why);
    if (kind == DHSA_TOK_PRE_NONE) {
        char runs[1024];
        supported_pre_names(runs, sizeof runs);
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "tokenizer: pre-tokenizer tokenizer.ggml.pre = '%s' is not implemented (%s%s); dhsa runs: %s",
                          dhsa__esc(pre), known ? "llama.cpp knows it: " : "", why, runs);
    }
    t->pre = kind;
    t->pre_flags = flags;
    /* llama.cpp: llama-bpe and tekken vocabularies add BOS unless the file says no */
    if ((flags & DHSA_TOK_PRE_ADD_BOS) && !file_sets_add_bos) t->add_bos = 1;
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Token attributes: the file's types, then llama.cpp's rules by token text
 * and model name (llama_vocab::impl::load in its src/llama-vocab.cpp; the
 * lists of texts below are those it has). docs/tokenizer.md says why each
 * matters. */

static uint8_t attr_of_type(uint8_t type) {
    switch (type) {
    case DHSA_TOKEN_NORMAL: return ATTR_NORMAL;
    case DHSA_TOKEN_UNKNOWN: return ATTR_UNKNOWN;
    case DHSA_TOKEN_CONTROL: return ATTR_CONTROL;
    case DHSA_TOKEN_USER_DEFINED: return ATTR_USER_DEFINED;
    case DHSA_TOKEN_UNUSED: return ATTR_UNUSED;
    case DHSA_TOKEN_BYTE: return ATTR_BYTE;
    default: return 0;
    }
}

/* Texts that end a generation in some model family: llama.cpp makes each
 * one a CONTROL token whatever the file says (phi-3's "</s>" is
 * USER_DEFINED in its file), so plain text never turns into them. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[", NULL};

/* Fill-in-the-middle texts, each kind with the keys that name its id: when
 * the file names none, llama.cpp finds the token by text and makes it
 * CONTROL. */
typedef struct {
    const char *keys[2];
    const char *texts[9];
} fim_kind;
static const fim_kind fim_kinds[] = {
    {{"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
     {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
      "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL}},
    {{"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
     {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>",
      "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL}},
    {{"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
     {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
      "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL}},
    {{"tokenizer.ggml.fim_pad_token_id", NULL}, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL}},
    {{"tokenizer.ggml.fim_rep_token_id", NULL},
     {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL}},
    {{"tokenizer.ggml.fim_sep_token_id", NULL}, {"<|file_sep|>", NULL}},
};

static int32_t find_text(const dhsa_tokenizer *t, const char *text) {
    return strtab_find(&t->tokens, text, (int64_t)strlen(text));
}

static void attr_set(dhsa_tokenizer *t, const char *text, uint8_t bits, int on) {
    int32_t id = find_text(t, text);
    if (id < 0) return; /* llama.cpp refuses the file here (phi-3 without "</s>"); dhsa goes on */
    t->attr[id] = (uint8_t)(on ? t->attr[id] | bits : t->attr[id] & ~bits);
}

/* An id key that names a token of the vocabulary (as llama.cpp reads it). */
static int has_valid_id(const dhsa_gguf *g, const char *key, int64_t n_vocab) {
    int64_t v;
    uint64_t u;
    if (!key || dhsa_gguf_find_kv(g, key) < 0) return 0;
    if (dhsa_gguf_get_i64(g, key, &v) == DHSA_OK) return v >= 0 && v < n_vocab;
    if (dhsa_gguf_get_u64(g, key, &u) == DHSA_OK) return u < (uint64_t)n_vocab;
    return 0;
}

static const char *opt_string(const dhsa_gguf *g, const char *key) {
    const char *v = NULL;
    if (dhsa_gguf_find_kv(g, key) < 0 || dhsa_gguf_get_str(g, key, &v, NULL) != DHSA_OK) return "";
    return v;
}

/* Case-insensitive (ASCII) substring test, as llama.cpp lowercases
 * general.name before it looks for a family in it. */
static int contains_icase(const char *s, const char *lower) {
    size_t m = strlen(lower);
    for (; *s; s++) {
        size_t k = 0;
        while (k < m && s[k] && (char)(s[k] >= 'A' && s[k] <= 'Z' ? s[k] + 32 : s[k]) == lower[k]) k++;
        if (k == m) return 1;
    }
    return 0;
}

/* In llama.cpp's order: control-looking texts become CONTROL; gpt-oss's
 * channel markers are USER_DEFINED only; harmony's and solar-open's <|end|>
 * is not an end of generation (USER_DEFINED) when <|return|>/<|call|> or
 * <|calls|>/<|flush|> are; a gemma4 or plamo </s> is NORMAL. */
static void apply_text_rules(dhsa_tokenizer *t, const dhsa_gguf *g) {
    for (const fim_kind *f = fim_kinds; f < fim_kinds + sizeof fim_kinds / sizeof fim_kinds[0]; f++) {
        if (has_valid_id(g, f->keys[0], t->n_vocab) || has_valid_id(g, f->keys[1], t->n_vocab)) continue;
        for (const char *const *x = f->texts; *x; x++) attr_set(t, *x, ATTR_CONTROL, 1);
    }
    for (const char *const *x = eog_texts; *x; x++) attr_set(t, *x, ATTR_CONTROL, 1);
    static const char *const gpt_oss[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *x = gpt_oss; *x; x++) {
        int32_t id = find_text(t, *x);
        if (id >= 0) t->attr[id] = ATTR_USER_DEFINED;
    }
    int has_call = find_text(t, "<|call|>") >= 0 || find_text(t, "<|calls|>") >= 0;
    int32_t end = find_text(t, "<|end|>");
    if (end >= 0 && has_call && (find_text(t, "<|return|>") >= 0 || find_text(t, "<|flush|>") >= 0))
        t->attr[end] = ATTR_USER_DEFINED;
    /* "<|plamo:eos|>" ends a generation only as the file's EOS */
    int32_t plamo = find_text(t, "<|plamo:eos|>"), s_end = find_text(t, "</s>");
    if (s_end >= 0 && (find_text(t, "<|tool_response>") >= 0 || (plamo >= 0 && plamo == t->eos)))
        t->attr[s_end] = ATTR_NORMAL;
}

/* Per-token strip rules, set after the special tokens are known: phi-3
 * (general.name) strips the whitespace after every special token but
 * <unk>, <s> and <|endoftext|>; a few BERT-like vocabularies strip it
 * before their mask token. */
static void apply_strip_rules(dhsa_tokenizer *t, const dhsa_gguf *g) {
    const char *name = opt_string(g, "general.name"), *arch = opt_string(g, "general.architecture");
    const char *pre = opt_string(g, "tokenizer.ggml.pre");
    if (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code") ||
        strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")) {
        attr_set(t, "<mask>", ATTR_LSTRIP, 1);
    } else if (contains_icase(name, "phi-3") || contains_icase(name, "phi3")) {
        for (int64_t k = 0; k < t->n_specials; k++) t->attr[t->specials[k]] |= ATTR_RSTRIP;
        attr_set(t, "</s>", ATTR_RSTRIP, 1);
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
        for (const char *const *x = keep; *x; x++) attr_set(t, *x, ATTR_RSTRIP, 0);
    } else if (contains_icase(name, "modern-bert")) {
        attr_set(t, "[MASK]", ATTR_LSTRIP, 1);
    }
}

/* Sort keys that carry what their comparison needs (qsort has no context). */
typedef struct {
    const char *text;
    int32_t len, id, index;
} special_key;

static int special_priority(const void *pa, const void *pb) { /* longest first, ties by id */
    const special_key *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int special_bytes(const void *pa, const void *pb) { /* byte order, a prefix first */
    const special_key *a = pa, *b = pb;
    int c = memcmp(a->text, b->text, (size_t)(a->len < b->len ? a->len : b->len));
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/* Builds specials (cut-out order) and special_lex (byte order). */
static dhsa_status build_specials(dhsa_tokenizer *t) {
    int64_t ns = 0;
    for (int64_t i = 0; i < t->n_vocab; i++) ns += (t->attr[i] & ATTR_SPECIAL) && t->tok_len[i] > 0;
    special_key *keys = malloc(sizeof *keys * (size_t)(ns ? ns : 1));
    t->specials = malloc(sizeof *t->specials * (size_t)(ns ? ns : 1));
    t->special_lex = malloc(sizeof *t->special_lex * (size_t)(ns ? ns : 1));
    if (!keys || !t->specials || !t->special_lex) {
        free(keys);
        return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    }
    ns = 0;
    for (int64_t i = 0; i < t->n_vocab; i++)
        if ((t->attr[i] & ATTR_SPECIAL) && t->tok_len[i] > 0)
            keys[ns++] = (special_key){t->tok_arena + t->tok_off[i], t->tok_len[i], (int32_t)i, 0};
    qsort(keys, (size_t)ns, sizeof *keys, special_priority);
    for (int64_t k = 0; k < ns; k++) {
        t->specials[k] = keys[k].id;
        keys[k].index = (int32_t)k;
    }
    qsort(keys, (size_t)ns, sizeof *keys, special_bytes);
    for (int64_t k = 0; k < ns; k++) t->special_lex[k] = keys[k].index;
    t->n_specials = ns;
    free(keys);
    return DHSA_OK;
}

dhsa_status dhsa_tokenizer_from_gguf(const dhsa_gguf *g, dhsa_tokenizer **out) {
    if (!out) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_tokenizer_from_gguf: out is NULL");
    *out = NULL;
    if (!g) return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_tokenizer_from_gguf: g is NULL");
    const char *model;
    dhsa_status st = dhsa_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (st) return st;
    dhsa_tokenizer_kind kind;
    if (strcmp(model, "llama") == 0) kind = DHSA_TOKENIZER_SPM;
    else if (strcmp(model, "gpt2") == 0) kind = DHSA_TOKENIZER_BPE;
    else
        return dhsa__fail(DHSA_ERR_UNSUPPORTED,
                          "tokenizer: tokenizer.ggml.model is '%s'; dhsa knows 'llama' (SentencePiece) and "
                          "'gpt2' (byte-level BPE)",
                          dhsa__esc(model));
    dhsa_gguf_array toks;
    if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks))) return st;
    if (toks.type != DHSA_GGUF_STRING || toks.n < 1)
        return dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens must be a non-empty array of strings");
    if (toks.n > DHSA_TOKENIZER_MAX_VOCAB)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "tokenizer: %lld tokens (limit %d)", (long long)toks.n,
                          DHSA_TOKENIZER_MAX_VOCAB);
    dhsa_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->kind = kind;
    t->n_vocab = toks.n;
    int64_t n = toks.n;
    if ((st = copy_strings(toks.data, n, "tokenizer.ggml.tokens", &t->tok_arena, &t->tok_off, &t->tok_len))) goto fail;
    t->scores = calloc((size_t)n, sizeof *t->scores);
    t->types = malloc((size_t)n);
    if (!t->scores || !t->types) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        goto fail;
    }
    memset(t->types, DHSA_TOKEN_NORMAL, (size_t)n);
    if (dhsa_gguf_find_kv(g, "tokenizer.ggml.scores") >= 0) {
        dhsa_gguf_array a;
        if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.scores", &a))) goto fail;
        if (a.n != n || (a.type != DHSA_GGUF_FLOAT32 && a.type != DHSA_GGUF_FLOAT64)) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores must be %lld floats (has %lld %s)",
                            (long long)n, (long long)a.n, dhsa_gguf_type_name(a.type));
            goto fail;
        }
        for (int64_t i = 0; i < n; i++)
            t->scores[i] = a.type == DHSA_GGUF_FLOAT32 ? ((const float *)a.data)[i] : (float)((const double *)a.data)[i];
    } else if (kind == DHSA_TOKENIZER_SPM) {
        st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: a 'llama' vocabulary needs tokenizer.ggml.scores");
        goto fail;
    }
    if (dhsa_gguf_find_kv(g, "tokenizer.ggml.token_type") >= 0) {
        dhsa_gguf_array a;
        if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.token_type", &a))) goto fail;
        if (a.n != n || (a.type != DHSA_GGUF_INT32 && a.type != DHSA_GGUF_UINT32)) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type must be %lld INT32 (has %lld %s)",
                            (long long)n, (long long)a.n, dhsa_gguf_type_name(a.type));
            goto fail;
        }
        for (int64_t i = 0; i < n; i++) {
            int32_t v = ((const int32_t *)a.data)[i];
            t->types[i] = (uint8_t)(v >= DHSA_TOKEN_NORMAL && v <= DHSA_TOKEN_BYTE ? v : DHSA_TOKEN_NORMAL);
        }
    }
    t->tokens = (strtab){t->tok_arena, t->tok_off, t->tok_len, n, NULL, 0};
    if ((st = strtab_build(&t->tokens, 1))) goto fail;

    int spm = kind == DHSA_TOKENIZER_SPM;
    if ((st = opt_id(g, "tokenizer.ggml.bos_token_id", n, spm ? 1 : -1, &t->bos))) goto fail;
    if ((st = opt_id(g, "tokenizer.ggml.eos_token_id", n, spm ? 2 : -1, &t->eos))) goto fail;
    if ((st = opt_id(g, "tokenizer.ggml.unknown_token_id", n, spm ? 0 : -1, &t->unk))) goto fail;
    if ((st = opt_bool(g, "tokenizer.ggml.add_bos_token", spm, &t->add_bos))) goto fail;
    if ((st = opt_bool(g, "tokenizer.ggml.add_eos_token", 0, &t->add_eos))) goto fail;
    if ((st = opt_bool(g, "tokenizer.ggml.add_space_prefix", spm, &t->add_space_prefix))) goto fail;

    if (spm) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_tok[b] = strtab_find(&t->tokens, name, 6);
        }
    } else {
        const char *pre = "default";
        if (dhsa_gguf_find_kv(g, "tokenizer.ggml.pre") >= 0 &&
            (st = dhsa_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL)))
            goto fail;
        if ((st = dhsa_tok__set_pre(t, pre, dhsa_gguf_find_kv(g, "tokenizer.ggml.add_bos_token") >= 0))) goto fail;
        dhsa_gguf_array m;
        if ((st = dhsa_gguf_get_arr(g, "tokenizer.ggml.merges", &m))) goto fail;
        if (m.type != DHSA_GGUF_STRING) {
            st = dhsa__fail(DHSA_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges must be an array of strings");
            goto fail;
        }
        if (m.n > DHSA_TOKENIZER_MAX_VOCAB) {
            st = dhsa__fail(DHSA_ERR_TOO_LARGE, "tokenizer: %lld merges (limit %d)", (long long)m.n,
                            DHSA_TOKENIZER_MAX_VOCAB);
            goto fail;
        }
        if ((st = copy_strings(m.data, m.n, "tokenizer.ggml.merges", &t->merge_arena, &t->merge_off,
                               &t->merge_len)))
            goto fail;
        t->merges = (strtab){t->merge_arena, t->merge_off, t->merge_len, m.n, NULL, 0};
        if ((st = strtab_build(&t->merges, 0))) goto fail;
        gpt2_byte_map(t);
    }

    /* Attributes, then the special tokens, then the strip rules (which
     * llama.cpp sets on the special tokens once it knows them). */
    t->attr = malloc((size_t)n);
    if (!t->attr) {
        st = dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) t->attr[i] = attr_of_type(t->types[i]);
    apply_text_rules(t, g);
    if ((st = build_specials(t))) goto fail;
    apply_strip_rules(t, g);
    *out = t;
    return DHSA_OK;
fail:
    dhsa_tokenizer_free(t);
    return st;
}

/* The bytes of one string table's arena, offsets, lengths and slots. */
static size_t strtab_heap(const strtab *st) {
    size_t n = st->n > 0 ? (size_t)st->n : 1;
    size_t arena = st->n > 0 ? (size_t)st->off[st->n - 1] + (size_t)st->len[st->n - 1] + 1 : 1;
    return dhsa__heap_block(arena) + dhsa__heap_block(n * sizeof *st->off) + dhsa__heap_block(n * sizeof *st->len) +
           (st->slots ? dhsa__heap_block((size_t)(st->mask + 1) * sizeof *st->slots) : 0);
}

size_t dhsa__tokenizer_heap_bytes(const dhsa_tokenizer *t) {
    if (!t) return 0;
    size_t n = t->n_vocab > 0 ? (size_t)t->n_vocab : 1, ns = t->n_specials > 0 ? (size_t)t->n_specials : 1;
    return dhsa__heap_block(sizeof *t) + strtab_heap(&t->tokens) + dhsa__heap_block(n * sizeof *t->scores) +
           2 * dhsa__heap_block(n) + (t->merge_arena ? strtab_heap(&t->merges) : 0) +
           2 * dhsa__heap_block(ns * sizeof *t->specials);
}

dhsa_tokenizer_kind dhsa_tokenizer_kind_of(const dhsa_tokenizer *t) { return t->kind; }
int64_t dhsa_tokenizer_n_vocab(const dhsa_tokenizer *t) { return t->n_vocab; }
int32_t dhsa_tokenizer_bos(const dhsa_tokenizer *t) { return t->bos; }
int32_t dhsa_tokenizer_eos(const dhsa_tokenizer *t) { return t->eos; }
int32_t dhsa_tokenizer_unk(const dhsa_tokenizer *t) { return t->unk; }
unsigned dhsa_tokenizer_default_flags(const dhsa_tokenizer *t) {
    return (t->add_bos ? DHSA_TOKENIZE_ADD_BOS : 0u) | (t->add_eos ? DHSA_TOKENIZE_ADD_EOS : 0u);
}
const char *dhsa_tokenizer_text(const dhsa_tokenizer *t, int32_t id, int64_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->tok_len[id];
    return t->tok_arena + t->tok_off[id];
}
int32_t dhsa_tok__find(const dhsa_tokenizer *t, const char *text, int64_t len) {
    if (!t || (!text && len > 0) || len < 0) return -1;
    return strtab_find(&t->tokens, text, len);
}
int dhsa_tokenizer_type(const dhsa_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    return t->types[id];
}

/* --------------------------------------------------------------------- */
/* Growable arrays and the merge queue                                    */

typedef struct {
    int32_t *v;
    int64_t n, cap;
} ivec;

static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t c = a->cap ? a->cap * 2 : 64;
        int32_t *p = realloc(a->v, sizeof *p * (size_t)c);
        if (!p) return -1;
        a->v = p;
        a->cap = c;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    int64_t start, n; /* bytes of the symbol in the (normalised) word */
    int32_t prev, next;
} symbol;

typedef struct {
    double key; /* higher merges first: SPM score, or -rank for BPE */
    int32_t left, right;
    int64_t size;
} bigram;

typedef struct {
    bigram *h;
    int64_t n, cap;
} heap;

static int bigram_before(const bigram *a, const bigram *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(heap *q, bigram b) { /* cap is sized by the caller */
    int64_t i = q->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!bigram_before(&b, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = b;
}

static bigram heap_pop(heap *q) {
    bigram top = q->h[0], last = q->h[--q->n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && bigram_before(&q->h[c + 1], &q->h[c])) c++;
        if (!bigram_before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n > 0) q->h[i] = last;
    return top;
}

/* Work buffers of one tokenize call, grown as needed. */
typedef struct {
    const dhsa_tokenizer *t;
    ivec *out;
    char *buf; /* normalised / byte-mapped word */
    int64_t buf_cap;
    symbol *sym;
    int64_t sym_cap;
    heap q;
    char *key; /* BPE merge key "left right" */
    int64_t key_cap;
    uint32_t *cp; /* pre-tokenizer: code points of the fragment */
    int64_t *cp_off;
    uint8_t *cat;
    int64_t *piece[2]; /* pre-tokenizer: piece ends, before / after a regex */
    int64_t cp_cap;
} work;

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = need < 64 ? 64 : need + need / 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static void work_free(work *w) {
    free(w->buf);
    free(w->sym);
    free(w->q.h);
    free(w->key);
    free(w->cp);
    free(w->cp_off);
    free(w->cat);
    free(w->piece[0]);
    free(w->piece[1]);
}

#define OOM() dhsa__fail(DHSA_ERR_OUT_OF_MEMORY, "tokenizer: out of memory")

/* Splits w->buf[0..len) into one symbol per character (SPM rule) and
 * sizes the queue: every merge adds at most two bigrams. */
static dhsa_status symbols_init(work *w, int64_t len, int64_t *n_sym) {
    if (grow((void **)&w->sym, &w->sym_cap, len + 1, sizeof *w->sym)) return OOM();
    int64_t n = 0;
    for (int64_t i = 0; i < len;) {
        int64_t c = spm_char_len(w->buf + i, len - i);
        w->sym[n] = (symbol){i, c, (int32_t)(n - 1), (int32_t)(n + 1)};
        n++;
        i += c;
    }
    if (n > 0) w->sym[n - 1].next = -1;
    int64_t qcap = w->q.cap;
    if (grow((void **)&w->q.h, &qcap, 3 * n + 1, sizeof *w->q.h)) return OOM();
    w->q.cap = qcap;
    w->q.n = 0;
    *n_sym = n;
    return DHSA_OK;
}

static dhsa_status push_id(work *w, int32_t id) { return ivec_push(w->out, id) ? OOM() : DHSA_OK; }

/* --------------------------------------------------------------------- */
/* SentencePiece                                                          */

static void spm_try_bigram(work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    int64_t size = w->sym[l].n + w->sym[r].n;
    int32_t id = strtab_find(&w->t->tokens, w->buf + w->sym[l].start, size);
    if (id < 0) return;
    heap_push(&w->q, (bigram){w->t->scores[id], l, r, size});
}

static dhsa_status spm_encode(work *w, const char *text, int64_t len, int add_prefix) {
    const dhsa_tokenizer *t = w->t;
    int64_t blen = 0;
    if (grow((void **)&w->buf, &w->buf_cap, 3 * len + 3, 1)) return OOM();
    if (add_prefix) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        blen = 3;
    }
    for (int64_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->buf + blen, "\xE2\x96\x81", 3);
            blen += 3;
        } else {
            w->buf[blen++] = text[i];
        }
    }
    int64_t n;
    dhsa_status st = symbols_init(w, blen, &n);
    if (st) return st;
    for (int64_t i = 1; i < n; i++) spm_try_bigram(w, (int32_t)(i - 1), (int32_t)i);
    while (w->q.n > 0) {
        bigram b = heap_pop(&w->q);
        symbol *L = &w->sym[b.left], *R = &w->sym[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->sym[R->next].prev = b.left;
        spm_try_bigram(w, L->prev, b.left);
        spm_try_bigram(w, b.left, L->next);
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const symbol *s = &w->sym[i];
        int32_t id = strtab_find(&t->tokens, w->buf + s->start, s->n);
        if (id >= 0) {
            if ((st = push_id(w, id))) return st;
            continue;
        }
        for (int64_t j = 0; j < s->n; j++) { /* byte fallback */
            int32_t bt = t->byte_tok[(uint8_t)w->buf[s->start + j]];
            if (bt < 0) bt = t->unk;
            if (bt >= 0 && (st = push_id(w, bt))) return st;
        }
    }
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Pre-tokenizers. llama.cpp runs a list of regexes in turn: each one splits
 * every piece the previous one left, its matches becoming pieces and so the
 * text between two matches (leftmost-first, as std::regex searches). Here
 * each regex is a hand-written matcher, stage_fn: the length (in code
 * points) of its match at i, looking no further than the piece end n; 0 for
 * no match at i; -k when no match can start in [i, i + k) (so long runs are
 * skipped in one step and every stage stays linear). The GPT-2 and Llama 3
 * regexes cover all text (every position starts a word): their stages never
 * return 0. */

typedef int64_t (*stage_fn)(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n);

static int64_t run_of(const uint8_t *cat, int64_t i, int64_t n, int c) {
    while (i < n && cat[i] == c) i++;
    return i;
}

static int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive. */
static int64_t contraction(const uint32_t *cp, int64_t i, int64_t n, int icase) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (icase) {
        if (a < 128) a = (uint32_t)(a | 0x20);
        if (b < 128 && b) b = (uint32_t)(b | 0x20);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at a whitespace character. */
static int64_t trailing_space(const uint8_t *cat, int64_t i, int64_t n) {
    int64_t k = run_of(cat, i, n, CAT_SPACE);
    if (k < n && k - i >= 2) return k - 1 - i;
    return k - i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int64_t stage_gpt2(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    int64_t m = contraction(cp, i, n, 0);
    if (m) return m;
    int64_t j = cp[i] == ' ' && i + 1 < n ? i + 1 : i;
    if (cat[j] == CAT_LETTER || cat[j] == CAT_NUMBER || cat[j] == CAT_OTHER) {
        if (j > i || cat[i] != CAT_SPACE) return run_of(cat, j, n, cat[j]) - i;
    }
    return trailing_space(cat, i, n);
}

/* The Llama 3 family: one regex of alternatives, tried in order at i,
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)       when contractions
 *   [^\r\n\p{L}\p{N}]?\p{L}+           (cased: the two rules below)
 *   \p{N}{1,max_digits}
 *    ?[^\s\p{L}\p{N}]+[\r\n]*          ([\r\n]* only when punct_newlines)
 *   \s*[\r\n]+
 *   \s+(?!\S)|\s+                      (jais2: \s{512}(?!\S)|...|\s{1,2}(?!\S)|\s{1})
 * Cased (gpt-4o, tekken): [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?
 * where U is a letter that is not a-z, L a letter that is not A-Z (a
 * letter above ASCII is both: llama.cpp's rewrite of \p{Lu}/\p{Ll} into
 * ASCII look-aheads) and C an optional contraction (gpt-4o). */
typedef struct {
    int contractions;     /* the contraction alternative comes first */
    int64_t max_digits;   /* \p{N}{1,max_digits} */
    int punct_newlines;   /* [\r\n]* after a punctuation run */
    int cased;            /* 1: gpt-4o's cased letter rules, 2: the same with no contraction suffix (tekken) */
    int jais_ws;          /* jais2's whitespace runs */
    int marks;            /* \p{M} joins \p{L} (qwen35: [\p{L}\p{M}]+, and no mark in punctuation runs;
                           * granite-embed-multi: the cased runs' look-aheads take marks) */
} l3_opts;

static int is_mark_cp(uint32_t c) {
    return c >= 0x300 && in_ranges(uni_mark, sizeof uni_mark / sizeof uni_mark[0], c);
}

static int is_upper_ascii(uint32_t c) { return c >= 'A' && c <= 'Z'; }
static int is_lower_ascii(uint32_t c) { return c >= 'a' && c <= 'z'; }

/* A letter, or with marks a letter or a combining mark. */
static int letter_like(const uint32_t *cp, const uint8_t *cat, int64_t i, int marks) {
    return cat[i] == CAT_LETTER || (marks && cat[i] == CAT_OTHER && is_mark_cp(cp[i]));
}

/* U*L+ (alt 1) or U+L* (alt 2) from j; the end, or -1. */
static int64_t cased_run(const uint32_t *cp, const uint8_t *cat, int64_t j, int64_t n, int alt, int marks) {
    int64_t u = j;
    while (u < n && letter_like(cp, cat, u, marks) && !is_lower_ascii(cp[u])) u++;
    if (alt == 2) {
        if (u == j) return -1;
    } else {
        /* U* gives back letters until L+ can start: the first L at or
         * before u, looking back from u (a letter above ASCII is both) */
        for (;; u--) {
            if (u < n && letter_like(cp, cat, u, marks) && !is_upper_ascii(cp[u])) break;
            if (u == j) return -1;
        }
    }
    while (u < n && letter_like(cp, cat, u, marks) && !is_upper_ascii(cp[u])) u++;
    return u;
}

static int64_t match_l3(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n, const l3_opts *o) {
    int64_t m;
    if (o->contractions && (m = contraction(cp, i, n, 1))) return m;
    int here = letter_like(cp, cat, i, o->marks);
    int prefix = !here && cat[i] != CAT_NUMBER && !is_crlf(cp[i]) && i + 1 < n && letter_like(cp, cat, i + 1, o->marks);
    if (o->cased) {
        int64_t e = -1;
        for (int alt = 1; alt <= 2 && e < 0; alt++) {
            if (prefix) e = cased_run(cp, cat, i + 1, n, alt, o->marks);
            if (e < 0 && here) e = cased_run(cp, cat, i, n, alt, o->marks);
        }
        if (e >= 0) {
            if (o->cased == 1 && (m = contraction(cp, e, n, 1))) e += m;
            return e - i;
        }
    } else if (here || prefix) {
        int64_t k = prefix ? i + 1 : i;
        while (k < n && letter_like(cp, cat, k, o->marks)) k++;
        return k - i;
    }
    if (cat[i] == CAT_NUMBER) {
        int64_t k = run_of(cat, i, n, CAT_NUMBER) - i;
        return k < o->max_digits ? k : o->max_digits;
    }
    int64_t j = cp[i] == ' ' && i + 1 < n ? i + 1 : i;
    if (cat[j] == CAT_OTHER && !(o->marks && !o->cased && is_mark_cp(cp[j]))) {
        int64_t k = j;
        while (k < n && cat[k] == CAT_OTHER && !(o->marks && !o->cased && is_mark_cp(cp[k]))) k++;
        if (o->punct_newlines)
            while (k < n && is_crlf(cp[k])) k++;
        return k - i;
    }
    /* cat[i] is whitespace here */
    int64_t k = run_of(cat, i, n, CAT_SPACE), last_nl = -1;
    for (int64_t x = i; x < k; x++)
        if (is_crlf(cp[x])) last_nl = x;
    if (last_nl >= 0) return last_nl + 1 - i;
    if (o->jais_ws) {
        /* \s{N}(?!\S) for N = 512, 256, ..., 4, then \s{1,2}(?!\S), \s{1} */
        int64_t r = k - i;
        for (int64_t len = 512; len >= 4; len /= 2)
            if (r > len || (r == len && k == n)) return len;
        if (r > 2 || (r == 2 && k == n)) return 2;
        return 1;
    }
    return trailing_space(cat, i, n);
}

static const l3_opts l3_llama3 = {1, 3, 1, 0, 0, 0}, l3_qwen2 = {1, 1, 1, 0, 0, 0}, l3_ufakzeka = {0, 1, 1, 0, 0, 0},
                     l3_minicpm5 = {1, INT64_MAX, 1, 0, 0, 0}, l3_seed_coder = {1, 1, 0, 0, 0, 0},
                     l3_jais2 = {1, 3, 1, 0, 1, 0}, l3_gpt4o = {0, 3, 1, 1, 0, 0}, l3_tekken = {0, 1, 1, 2, 0, 0},
                     l3_qwen35 = {1, 1, 1, 0, 0, 1}, l3_granite_multi = {0, 3, 1, 1, 0, 1};

static int64_t stage_llama3(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_llama3);
}
static int64_t stage_qwen2(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_qwen2);
}
static int64_t stage_ufakzeka(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_ufakzeka);
}
static int64_t stage_minicpm5(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_minicpm5);
}
static int64_t stage_seed_coder(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_seed_coder);
}
static int64_t stage_jais2(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_jais2);
}
static int64_t stage_gpt4o(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_gpt4o);
}
static int64_t stage_qwen35(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_qwen35);
}
static int64_t stage_granite_multi(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_granite_multi);
}
static int64_t stage_tekken(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return match_l3(cp, cat, i, n, &l3_tekken);
}

/* \p{N}{1,3} alone (minicpm5's first regex). */
static int64_t stage_digits3(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    int64_t k = run_of(cat, i, n, CAT_NUMBER) - i;
    return k < 3 ? k : 3;
}

/* [^\n]+|[\n]+ (laguna's first regex): runs of newlines and of the rest. */
static int64_t stage_newline_runs(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t k = i;
    int nl = cp[i] == '\n';
    while (k < n && (cp[k] == '\n') == nl) k++;
    return k - i;
}

/* bloom:  ?[^(\s|.,!?…。，、।۔،)]+ (a character class, parentheses and bar included) */
static int bloom_word_char(uint32_t c) {
    if (is_space_cp(c)) return 0;
    switch (c) {
    case '(': case '|': case '.': case ',': case '!': case '?': case ')':
    case 0x2026: case 0x3002: case 0xFF0C: case 0x3001: case 0x0964: case 0x06D4: case 0x060C: return 0;
    default: return 1;
    }
}

static int64_t stage_bloom(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t j = cp[i] == ' ' && i + 1 < n && bloom_word_char(cp[i + 1]) ? i + 1 : i;
    if (!bloom_word_char(cp[j])) return 0;
    while (j < n && bloom_word_char(cp[j])) j++;
    return j - i;
}

/* \p{N}: each number character alone (starcoder). */
static int64_t stage_digit(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    (void)n;
    return cat[i] == CAT_NUMBER;
}

/* \p{N}+ (deepseek-llm's last regex). */
static int64_t stage_numbers(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    return run_of(cat, i, n, CAT_NUMBER) - i;
}

/* A class test for code points; whitespace never belongs to a class here:
 * llama.cpp hands a regex without \p{..} to std::wregex after replacing
 * every non-ASCII whitespace character by 0x0B, so only \s can match it. */
typedef int (*class_fn)(uint32_t c);

/* \s?[class]+, where the class holds no whitespace. */
static int64_t space_opt_run(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n, class_fn in) {
    int64_t j = i;
    if (cat[i] == CAT_SPACE) {
        if (i + 1 >= n || cat[i + 1] == CAT_SPACE || !in(cp[i + 1])) return 0;
        j = i + 1;
    } else if (!in(cp[i])) {
        return 0;
    }
    while (j < n && cat[j] != CAT_SPACE && in(cp[j])) j++;
    return j - i;
}

/* ---- falcon: [\p{P}\$\+<=>\^~\|`]+, then GPT-2, then [0-9][0-9][0-9] */

/* \p{P} or $+<=>^~|`: every ASCII punctuation or symbol character, and the
 * Unicode punctuation (not the symbols) above ASCII. */
static int falcon_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                          (c >= 0x7B && c <= 0x7E);
    return !is_space_cp(c) && in_ranges(uni_punct, sizeof uni_punct / sizeof uni_punct[0], c);
}

static int64_t stage_falcon_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t j = i;
    while (j < n && falcon_punct(cp[j])) j++;
    return j - i;
}

/* "default": [\p{P}\$\+<=>\^~\|]+, falcon's class without the backtick. */
static int default_punct(uint32_t c) { return c != '`' && falcon_punct(c); }

static int64_t stage_default_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    int64_t j = i;
    while (j < n && default_punct(cp[j])) j++;
    return j - i;
}

/* ---- deepseek-coder: [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK]+, \p{N} */

static int is_letter_cp(uint32_t c) { return cp_category(c) == CAT_LETTER; }

/* \p{P} as llama.cpp matches it: the ASCII punctuation !-#%-*,-/:;?@[-]_{}
 * (not the symbols $+<=>^`|~) and Unicode punctuation above ASCII. */
static int is_punct_cp(uint32_t c) {
    if (c < 0x80) return c != '$' && c != '+' && c != '<' && c != '=' && c != '>' && c != '^' && c != '`' &&
                         c != '|' && c != '~' && falcon_punct(c);
    return falcon_punct(c);
}

static int64_t stage_space_letters(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, is_letter_cp);
}

static int64_t stage_space_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, is_punct_cp);
}

static int64_t stage_three_digits(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    for (int64_t k = 0; k < 3; k++)
        if (i + k >= n || cp[i + k] < '0' || cp[i + k] > '9') return 0;
    return 3;
}

/* ---- deepseek-llm: [\r\n], \s?[letters]+, \s?[punctuation]+, \s+$,
 * [CJK]+, \p{N}+ (the classes are literal lists in its tokenizer.json) */

static int64_t stage_newline(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cat;
    (void)n;
    return is_crlf(cp[i]);
}

static int ds_is_letter(uint32_t c) {
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return in_ranges(ds_letter, sizeof ds_letter / sizeof ds_letter[0], c);
}

static int64_t stage_ds_letters(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, ds_is_letter);
}

/* [!-/:-~！-／：-～‘-‟　-。]: note :-~ holds the ASCII letters too (the
 * letters stage has isolated them already) and U+3000 is whitespace. */
static int ds_is_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) ||
           (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3001 && c <= 0x3002);
}

static int64_t stage_ds_punct(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    return space_opt_run(cp, cat, i, n, ds_is_punct);
}

/* \s+$: the whitespace run at the end of the piece. */
static int64_t stage_trailing_ws(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    (void)cp;
    if (cat[i] != CAT_SPACE) return 0;
    int64_t k = run_of(cat, i, n, CAT_SPACE);
    return k == n ? k - i : -(k - i); /* no match starts inside an inner run */
}

/* [一-龥ࠀ-一가-퟿]: U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF. */
static int ds_is_cjk(uint32_t c) {
    return (c >= 0x800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF);
}

static int64_t stage_ds_cjk(const uint32_t *cp, const uint8_t *cat, int64_t i, int64_t n) {
    int64_t j = i;
    while (j < n && cat[j] != CAT_SPACE && ds_is_cjk(cp[j])) j++;
    return j - i;
}

/* The regexes of each pre-tokenizer, in order (NULL-terminated). */
static const stage_fn *pre_stages(dhsa_tok_pre pre) {
    static const stage_fn gpt2[] = {stage_gpt2, NULL};
    static const stage_fn starcoder[] = {stage_digit, stage_gpt2, NULL};
    static const stage_fn llama3[] = {stage_llama3, NULL};
    static const stage_fn qwen2[] = {stage_qwen2, NULL};
    static const stage_fn deepseek[] = {stage_newline, stage_ds_letters, stage_ds_punct, stage_trailing_ws,
                                        stage_ds_cjk,  stage_numbers,    NULL};
    static const stage_fn falcon[] = {stage_falcon_punct, stage_gpt2, stage_three_digits, NULL};
    static const stage_fn deflt[] = {stage_default_punct, stage_gpt2, stage_numbers, stage_three_digits, NULL};
    static const stage_fn ds_coder[] = {stage_newline, stage_space_letters, stage_space_punct, stage_ds_cjk,
                                        stage_digit, NULL};
    static const stage_fn bloom[] = {stage_bloom, NULL};
    static const stage_fn viking[] = {stage_bloom, stage_digit, NULL};
    static const stage_fn ufakzeka[] = {stage_ufakzeka, NULL};
    static const stage_fn minicpm5[] = {stage_digits3, stage_minicpm5, NULL};
    static const stage_fn seed_coder[] = {stage_seed_coder, NULL};
    static const stage_fn laguna[] = {stage_newline_runs, stage_qwen2, NULL};
    static const stage_fn jais2[] = {stage_jais2, NULL};
    static const stage_fn gpt4o[] = {stage_gpt4o, NULL};
    static const stage_fn tekken[] = {stage_tekken, NULL};
    static const stage_fn qwen35[] = {stage_qwen35, NULL};
    static const stage_fn granite_multi[] = {stage_granite_multi, NULL};
    switch (pre) {
    case DHSA_TOK_PRE_STARCODER: return starcoder;
    case DHSA_TOK_PRE_LLAMA3: return llama3;
    case DHSA_TOK_PRE_QWEN2: return qwen2;
    case DHSA_TOK_PRE_DEEPSEEK_LLM: return deepseek;
    case DHSA_TOK_PRE_FALCON: return falcon;
    case DHSA_TOK_PRE_DEFAULT: return deflt;
    case DHSA_TOK_PRE_DEEPSEEK_CODER: return ds_coder;
    case DHSA_TOK_PRE_BLOOM: return bloom;
    case DHSA_TOK_PRE_VIKING: return viking;
    case DHSA_TOK_PRE_UFAKZEKA: return ufakzeka;
    case DHSA_TOK_PRE_MINICPM5: return minicpm5;
    case DHSA_TOK_PRE_SEED_CODER: return seed_coder;
    case DHSA_TOK_PRE_LAGUNA: return laguna;
    case DHSA_TOK_PRE_JAIS2: return jais2;
    case DHSA_TOK_PRE_GPT4O: return gpt4o;
    case DHSA_TOK_PRE_TEKKEN: return tekken;
    case DHSA_TOK_PRE_QWEN35: return qwen35;
    case DHSA_TOK_PRE_GRANITE_MULTI: return granite_multi;
    default: return gpt2;
    }
}

/* One regex over every piece: in[0..n_in) are piece ends (code points);
 * writes the new ends to out (at most one per code point); returns their
 * count. */
static int64_t split_pieces(stage_fn f, const uint32_t *cp, const uint8_t *cat, const int64_t *in, int64_t n_in,
                            int64_t *out) {
    int64_t n_out = 0;
    for (int64_t p = 0, start = 0; p < n_in; start = in[p++]) {
        int64_t end = in[p], gap = start;
        for (int64_t i = start; i < end;) {
            int64_t m = f(cp, cat, i, end);
            if (m <= 0) {
                i += m < 0 ? -m : 1;
                continue;
            }
            if (i > gap) out[n_out++] = i;
            i += m;
            out[n_out++] = i;
            gap = i;
        }
        if (gap < end) out[n_out++] = end;
    }
    return n_out;
}

dhsa_status dhsa_tok__pretokenize(dhsa_tok_pre pre, const char *text, int64_t len, int64_t *ends, int64_t cap,
                                  int64_t *n_words, void *scratch_) {
    work *w = scratch_;
    work local = {0};
    if (!w) w = &local;
    if (len + 1 > w->cp_cap) {
        int64_t c = len + 1 + (len + 1) / 2;
        uint32_t *a = realloc(w->cp, sizeof *a * (size_t)c);
        if (a) w->cp = a;
        int64_t *b = realloc(w->cp_off, sizeof *b * (size_t)c);
        if (b) w->cp_off = b;
        uint8_t *d = realloc(w->cat, (size_t)c);
        if (d) w->cat = d;
        int64_t *e = realloc(w->piece[0], sizeof *e * (size_t)c);
        if (e) w->piece[0] = e;
        int64_t *f = realloc(w->piece[1], sizeof *f * (size_t)c);
        if (f) w->piece[1] = f;
        if (!a || !b || !d || !e || !f) {
            if (w == &local) work_free(&local);
            return OOM();
        }
        w->cp_cap = c;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < len;) {
        int64_t k;
        uint32_t c = bpe_decode((const uint8_t *)text + i, len - i, &k);
        w->cp[n] = c;
        w->cat[n] = (uint8_t)cp_category(c);
        w->cp_off[n++] = i;
        i += k;
    }
    w->cp_off[n] = len;
    /* pieces ping-pong between the two buffers, one regex at a time */
    int64_t *cur = w->piece[0], *next = w->piece[1], n_cur = 0;
    if (n > 0) cur[n_cur++] = n;
    for (const stage_fn *s = pre_stages(pre); *s; s++) {
        n_cur = split_pieces(*s, w->cp, w->cat, cur, n_cur, next);
        int64_t *t = cur;
        cur = next;
        next = t;
    }
    for (int64_t i = 0; i < n_cur && i < cap; i++) ends[i] = w->cp_off[cur[i]];
    *n_words = n_cur;
    if (w == &local) work_free(&local);
    return DHSA_OK;
}

/* --------------------------------------------------------------------- */
/* Byte-level BPE                                                         */

static void bpe_try_bigram(work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const symbol *L = &w->sym[l], *R = &w->sym[r];
    int64_t kl = L->n + 1 + R->n;
    memcpy(w->key, w->buf + L->start, (size_t)L->n);
    w->key[L->n] = ' ';
    memcpy(w->key + L->n + 1, w->buf + R->start, (size_t)R->n);
    int32_t rank = strtab_find(&w->t->merges, w->key, kl);
    if (rank < 0) return;
    heap_push(&w->q, (bigram){-(double)rank, l, r, L->n + R->n});
}

/* One pre-tokenized word: its code points (bpe_decode: invalid UTF-8 is
 * U+FFFD, as in llama.cpp) as UTF-8, each byte as its GPT-2 code point,
 * then merges. */
static dhsa_status bpe_word(work *w, const char *text, int64_t len) {
    const dhsa_tokenizer *t = w->t;
    /* a byte becomes at most 3 (U+FFFD), each of those at most 2 */
    if (grow((void **)&w->buf, &w->buf_cap, 6 * len + 1, 1) || grow((void **)&w->key, &w->key_cap, 12 * len + 2, 1))
        return OOM();
    int64_t blen = 0;
    for (int64_t i = 0; i < len;) {
        int64_t k;
        char u[4];
        int nu = utf8_encode(bpe_decode((const uint8_t *)text + i, len - i, &k), u);
        for (int j = 0; j < nu; j++) blen += utf8_encode(t->byte_to_cp[(uint8_t)u[j]], w->buf + blen);
        i += k;
    }
    dhsa_status st;
    if (t->pre_flags & DHSA_TOK_PRE_IGNORE_MERGES) { /* llama.cpp's ignore_merges: a whole-word token wins */
        int32_t id = strtab_find(&t->tokens, w->buf, blen);
        if (id >= 0) return push_id(w, id);
    }
    int64_t n;
    if ((st = symbols_init(w, blen, &n))) return st;
    for (int64_t i = 1; i < n; i++) bpe_try_bigram(w, (int32_t)(i - 1), (int32_t)i);
    while (w->q.n > 0) {
        bigram b = heap_pop(&w->q);
        symbol *L = &w->sym[b.left], *R = &w->sym[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->sym[R->next].prev = b.left;
        bpe_try_bigram(w, L->prev, b.left);
        bpe_try_bigram(w, b.left, L->next);
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const symbol *s = &w->sym[i];
        int32_t id = strtab_find(&t->tokens, w->buf + s->start, s->n);
        if (id >= 0) {
            if ((st = push_id(w, id))) return st;
            continue;
        }
        /* a symbol no token covers: llama.cpp looks each of its bytes up as
         * a one-byte token and drops those that are none (never unk) */
        for (int64_t j = 0; j < s->n; j++) {
            id = strtab_find(&t->tokens, w->buf + s->start + j, 1);
            if (id >= 0 && (st = push_id(w, id))) return st;
        }
    }
    return DHSA_OK;
}

static dhsa_status bpe_encode(work *w, const char *text, int64_t len) {
    int64_t n_words;
    dhsa_status st = dhsa_tok__pretokenize(w->t->pre, text, len, NULL, 0, &n_words, w);
    if (st) return st;
    int64_t *ends = malloc(sizeof *ends * (size_t)(n_words ? n_words : 1));
    if (!ends) return OOM();
    st = dhsa_tok__pretokenize(w->t->pre, text, len, ends, n_words, &n_words, w);
    for (int64_t i = 0, start = 0; st == DHSA_OK && i < n_words; start = ends[i++])
        st = bpe_word(w, text + start, ends[i] - start);
    free(ends);
    return st;
}

/* --------------------------------------------------------------------- */
/* Tokenize                                                               */

/* Special tokens are cut out of the text first, as llama.cpp's
 * tokenizer_st_partition does it: token by token in the order of
 * t->specials (longest first), each one's leftmost non-overlapping
 * occurrences in the text that is still raw, and each cut drops the ASCII
 * whitespace (C isspace) before it (LSTRIP) or after it (RSTRIP). A CONTROL
 * or UNKNOWN token is cut only with DHSA_TOKENIZE_PARSE_SPECIAL and only
 * where it does not touch a plain span (chat contents). Only the tokens the
 * text holds at all take a pass over it: a walk down the byte-sorted list
 * from each position finds them. */

typedef struct {
    int64_t off, len; /* bytes of the text */
    int32_t id;       /* the token, or -1: raw text */
} frag;

typedef struct {
    frag *v;
    int64_t n, cap;
} fragvec;

static int frag_push(fragvec *f, int64_t off, int64_t len, int32_t id) {
    if (f->n == f->cap && grow((void **)&f->v, &f->cap, f->n + 1, sizeof *f->v)) return -1;
    f->v[f->n++] = (frag){off, len, id};
    return 0;
}

static int c_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Does [m, m + n) touch one of the plain spans (sorted, disjoint, [2k, 2k+1))? */
static int in_plain(const int64_t *plain, int64_t n_plain, int64_t m, int64_t n) {
    int64_t lo = 0, hi = n_plain;
    while (lo < hi) { /* the first span that ends after m */
        int64_t mid = lo + (hi - lo) / 2;
        if (plain[2 * mid + 1] <= m) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_plain && plain[2 * lo] < m + n;
}

/* Marks seen[k] for every special token k (index into t->specials) that
 * occurs in text[0..len) and may be cut (CONTROL and UNKNOWN only when
 * parse). */
static void find_present(const dhsa_tokenizer *t, const char *text, int64_t len, int parse, uint8_t *seen) {
    const int32_t *lex = t->special_lex;
    for (int64_t p = 0; p < len; p++) {
        int64_t lo = 0, hi = t->n_specials;
        for (int64_t d = 0;; d++) {
            /* [lo, hi) share the first d bytes, text[p..p+d) included */
            while (lo < hi && t->tok_len[t->specials[lex[lo]]] == d) {
                int32_t id = t->specials[lex[lo]];
                if (parse || !(t->attr[id] & ATTR_PARSE_ONLY)) seen[lex[lo]] = 1;
                lo++;
            }
            if (lo >= hi || p + d >= len) break;
            uint8_t c = (uint8_t)text[p + d];
            int64_t a = lo, b = hi; /* first entry whose byte d is >= c */
            while (a < b) {
                int64_t mid = a + (b - a) / 2;
                int32_t id = t->specials[lex[mid]];
                if ((uint8_t)t->tok_arena[t->tok_off[id] + d] < c) a = mid + 1;
                else b = mid;
            }
            int64_t e = a, f = hi; /* first entry whose byte d is > c */
            while (e < f) {
                int64_t mid = e + (f - e) / 2;
                int32_t id = t->specials[lex[mid]];
                if ((uint8_t)t->tok_arena[t->tok_off[id] + d] <= c) e = mid + 1;
                else f = mid;
            }
            lo = a;
            hi = e;
        }
    }
}

/* The leftmost occurrence of token id in text[from..end) that may be cut,
 * or -1. */
static int64_t find_cut(const dhsa_tokenizer *t, int32_t id, const char *text, int64_t from, int64_t end,
                        const int64_t *plain, int64_t n_plain) {
    const char *s = t->tok_arena + t->tok_off[id];
    int64_t n = t->tok_len[id];
    int check = (t->attr[id] & ATTR_PARSE_ONLY) && n_plain > 0;
    while (end - from >= n) {
        const char *hit = memmem(text + from, (size_t)(end - from), s, (size_t)n);
        if (!hit) return -1;
        int64_t m = hit - text;
        if (!check || !in_plain(plain, n_plain, m, n)) return m;
        from = m + 1;
    }
    return -1;
}

/* One special token's pass over the raw fragments of cur, into next. */
static int cut_token(const dhsa_tokenizer *t, int32_t id, const char *text, const fragvec *cur, fragvec *next,
                     const int64_t *plain, int64_t n_plain) {
    const int64_t n = t->tok_len[id];
    const uint8_t attr = t->attr[id];
    next->n = 0;
    for (int64_t i = 0; i < cur->n; i++) {
        frag f = cur->v[i];
        if (f.id >= 0) {
            if (frag_push(next, f.off, f.len, f.id)) return -1;
            continue;
        }
        int64_t base = f.off, end = f.off + f.len;
        for (;;) {
            int64_t m = find_cut(t, id, text, base, end, plain, n_plain);
            if (m < 0) {
                if (end > base && frag_push(next, base, end - base, -1)) return -1;
                break;
            }
            int64_t left_end = m;
            if (attr & ATTR_LSTRIP)
                while (left_end > base && c_isspace(text[left_end - 1])) left_end--;
            if (left_end > base && frag_push(next, base, left_end - base, -1)) return -1;
            if (frag_push(next, m, n, id)) return -1;
            base = m + n;
            if (attr & ATTR_RSTRIP)
                while (base < end && c_isspace(text[base])) base++;
        }
    }
    return 0;
}

static dhsa_status partition(const dhsa_tokenizer *t, const char *text, int64_t len, int parse, const int64_t *plain,
                             int64_t n_plain, fragvec *out) {
    fragvec other = {0};
    out->n = 0;
    if (len > 0 && frag_push(out, 0, len, -1)) return OOM();
    if (len == 0 || t->n_specials == 0) return DHSA_OK;
    uint8_t *seen = calloc((size_t)t->n_specials, 1);
    if (!seen) return OOM();
    find_present(t, text, len, parse, seen);
    dhsa_status st = DHSA_OK;
    for (int64_t k = 0; k < t->n_specials && st == DHSA_OK; k++) {
        if (!seen[k]) continue;
        if (cut_token(t, t->specials[k], text, out, &other, plain, n_plain)) {
            st = OOM();
            break;
        }
        fragvec tmp = *out;
        *out = other;
        other = tmp;
    }
    free(other.v);
    free(seen);
    return st;
}

static dhsa_status encode_fragment(work *w, const char *text, int64_t len, int prev_special) {
    if (w->t->kind == DHSA_TOKENIZER_SPM) return spm_encode(w, text, len, w->t->add_space_prefix && prev_special);
    return bpe_encode(w, text, len);
}

int64_t dhsa_tokenize_max_ids(int64_t len) { return len < 0 ? 0 : 3 * len + 5; }

static dhsa_status tokenize_spans(const char *fn, const dhsa_tokenizer *t, const char *text, int64_t len,
                                  unsigned flags, const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                  int64_t *n_ids) {
    if (!t || !n_ids || len < 0 || (!text && len > 0) || cap < 0 || (!ids && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: t, n_ids and text must be given, len and cap >= 0", fn);
    *n_ids = 0;
    if (len > DHSA_TOKENIZER_MAX_TEXT)
        return dhsa__fail(DHSA_ERR_TOO_LARGE, "%s: %lld bytes of text (limit %lld)", fn, (long long)len,
                          (long long)DHSA_TOKENIZER_MAX_TEXT);
    ivec out = {0};
    work w = {0};
    fragvec frags = {0};
    w.t = t;
    w.out = &out;
    dhsa_status st = DHSA_OK;
    if ((flags & DHSA_TOKENIZE_ADD_BOS) && t->bos >= 0) st = push_id(&w, t->bos);
    if (st == DHSA_OK)
        st = partition(t, text, len, (flags & DHSA_TOKENIZE_PARSE_SPECIAL) != 0, plain, n_plain, &frags);
    int prev_special = 1; /* the SPM space prefix: at the start and after each special token */
    for (int64_t i = 0; st == DHSA_OK && i < frags.n; i++) {
        const frag *f = &frags.v[i];
        if (f->id >= 0) {
            st = push_id(&w, f->id);
            prev_special = 1;
        } else {
            st = encode_fragment(&w, text + f->off, f->len, prev_special);
            prev_special = 0;
        }
    }
    if (st == DHSA_OK && (flags & DHSA_TOKENIZE_ADD_EOS) && t->eos >= 0) st = push_id(&w, t->eos);
    work_free(&w);
    free(frags.v);
    if (st == DHSA_OK) {
        *n_ids = out.n;
        if (out.n && cap > 0) memcpy(ids, out.v, sizeof *ids * (size_t)(out.n < cap ? out.n : cap));
        if (out.n > cap)
            st = dhsa__fail(DHSA_ERR_INVALID_ARG, "%s: the text needs %lld ids, cap is %lld", fn, (long long)out.n,
                            (long long)cap);
    }
    free(out.v);
    return st;
}

dhsa_status dhsa_tokenize(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags, int32_t *ids,
                          int64_t cap, int64_t *n_ids) {
    return tokenize_spans("dhsa_tokenize", t, text, len, flags, NULL, 0, ids, cap, n_ids);
}

dhsa_status dhsa_tok__tokenize_plain_spans(const dhsa_tokenizer *t, const char *text, int64_t len, unsigned flags,
                                          const int64_t *plain, int64_t n_plain, int32_t *ids, int64_t cap,
                                          int64_t *n_ids) {
    if (n_plain < 0 || (n_plain > 0 && !plain))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_tok__tokenize_plain_spans: n_plain < 0 or plain NULL");
    for (int64_t k = 0; k < n_plain; k++)
        if (plain[2 * k] < (k ? plain[2 * k - 1] : 0) || plain[2 * k + 1] < plain[2 * k] || plain[2 * k + 1] > len)
            return dhsa__fail(DHSA_ERR_INVALID_ARG,
                              "dhsa_tok__tokenize_plain_spans: span %lld [%lld, %lld) is not sorted, disjoint "
                              "and inside the %lld bytes",
                              (long long)k, (long long)plain[2 * k], (long long)plain[2 * k + 1], (long long)len);
    return tokenize_spans("dhsa_tokenize", t, text, len, flags | DHSA_TOKENIZE_PARSE_SPECIAL, plain, n_plain, ids,
                          cap, n_ids);
}

/* --------------------------------------------------------------------- */
/* Detokenize                                                             */

typedef struct {
    char *out;
    int64_t cap, len;
    int strip; /* drop the next byte if it is a space */
} sink;

static void put(sink *s, const char *p, int64_t n) {
    if (n > 0 && s->strip) {
        s->strip = 0;
        if (p[0] == ' ') {
            p++;
            n--;
        }
    }
    for (int64_t i = 0; i < n; i++, s->len++)
        if (s->len < s->cap) s->out[s->len] = p[i];
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static void piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, sink *s) {
    const char *p = t->tok_arena + t->tok_off[id];
    int64_t n = t->tok_len[id];
    int type = t->types[id];
    if (t->attr[id] & ATTR_CONTROL) { /* phi-3's USER_DEFINED "</s>" too: it is CONTROL here */
        if (flags & DHSA_DETOKENIZE_SPECIAL) put(s, p, n);
        return;
    }
    if (t->attr[id] & ATTR_USER_DEFINED) {
        put(s, p, n);
        return;
    }
    if (t->kind == DHSA_TOKENIZER_SPM) {
        if (type == DHSA_TOKEN_BYTE && n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' &&
            hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
            char b = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            put(s, &b, 1);
            return;
        }
        if (type == DHSA_TOKEN_UNKNOWN) {
            put(s, " \xE2\x81\x87 ", 5); /* " ⁇ ", as SentencePiece renders unk */
            return;
        }
        for (int64_t i = 0; i < n;) {
            if (n - i >= 3 && memcmp(p + i, "\xE2\x96\x81", 3) == 0) {
                put(s, " ", 1);
                i += 3;
            } else {
                put(s, p + i, 1);
                i++;
            }
        }
        return;
    }
    for (int64_t i = 0; i < n;) { /* BPE: code points back to bytes */
        int64_t k;
        uint32_t c = utf8_decode((const uint8_t *)p + i, n - i, &k);
        if (c < 512 && t->cp_is_byte[c]) {
            char b = (char)t->cp_to_byte[c];
            put(s, &b, 1);
        } else {
            put(s, p + i, k);
        }
        i += k;
    }
}

dhsa_status dhsa_token_to_piece(const dhsa_tokenizer *t, int32_t id, unsigned flags, char *out, int64_t cap,
                                int64_t *len) {
    if (!t || !len || cap < 0 || (!out && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_token_to_piece: t and len must be given, cap >= 0");
    *len = 0;
    if (id < 0 || id >= t->n_vocab)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_token_to_piece: id %d is outside the vocab (%lld tokens)",
                          (int)id, (long long)t->n_vocab);
    sink s = {out, cap, 0, 0};
    piece(t, id, flags, &s);
    *len = s.len;
    if (s.len > cap)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_token_to_piece: the piece is %lld bytes, cap is %lld",
                          (long long)s.len, (long long)cap);
    return DHSA_OK;
}

dhsa_status dhsa_detokenize(const dhsa_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags, char *out,
                            int64_t cap, int64_t *len) {
    if (!t || !len || n < 0 || (!ids && n > 0) || cap < 0 || (!out && cap > 0))
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_detokenize: t, ids and len must be given, n and cap >= 0");
    *len = 0;
    const int strip = t->add_space_prefix && !(flags & DHSA_DETOKENIZE_KEEP_SPACE);
    sink s = {out, cap, 0, strip};
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_detokenize: ids[%lld] = %d is outside the vocab (%lld)",
                              (long long)i, (int)ids[i], (long long)t->n_vocab);
        if (t->attr[ids[i]] & (ATTR_CONTROL | ATTR_USER_DEFINED)) {
            /* dhsa_tokenize gives the text after a special token a space
             * prefix of its own, as at the start: the special piece keeps
             * its bytes, and the next piece loses that space again */
            s.strip = 0;
            piece(t, ids[i], flags, &s);
            s.strip = strip;
        } else {
            piece(t, ids[i], flags, &s);
        }
    }
    *len = s.len;
    if (s.len > cap)
        return dhsa__fail(DHSA_ERR_INVALID_ARG, "dhsa_detokenize: the text is %lld bytes, cap is %lld",
                          (long long)s.len, (long long)cap);
    return DHSA_OK;
}
